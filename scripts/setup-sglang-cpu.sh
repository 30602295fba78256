#!/usr/bin/env bash
# Create (or reuse) the private Python environment of the real SGLang engine on a CPU (no GPU).
#
# Usage: scripts/setup-sglang-cpu.sh [--fresh] [VENV_DIR]
#   VENV_DIR  default: $AGENTLOAD_SGLANG_VENV, else <repo>/.engine-venv/sglang (gitignored)
#   --fresh   delete VENV_DIR first (CI does this: an engine venv is never reused across clones)
# Env:  AGENTLOAD_WHEELS  a folder of local wheels (default /opt/wheels when it exists)
#       SGLANG_EXTRA_PIP_ARGS  extra pip arguments, e.g. an index that serves torch==2.13.0+cpu
# Prints the engine's python path on the last line of stdout. Start the server with
# SGLANG_USE_CPU_ENGINE=1 (without it --device cpu needs vLLM's kernels). docs/sglang-cpu.md.
#
# What it installs (sglang 0.5.22, the paper's version; ~90 s from the registry, ~3.4 GB):
#   1. torch==2.13.0+cpu (a local wheel found through pip's find-links), never the CUDA torch;
#   2. sglang's own requirement list minus the CUDA/GPU-only entries
#      (scripts/sglang_cpu/requirements-0.5.22.txt), constrained to that torch;
#   3. sglang==0.5.22 and torchvision==0.28.0 with --no-deps;
#   4. a guard in torchvision that lets the (CUDA) PyPI build import with CPU torch
#      (scripts/sglang_cpu/torchvision_fix.py; reversible, the original is kept);
#   5. our pure-torch `sgl_kernel` stand-in (scripts/sglang_cpu/sgl_kernel) into site-packages,
#      because no CPU build of sgl-kernel is on any registry.
# Steps 4 and 5 run on every call (they are idempotent and take well under a second), so a reused
# venv always carries the stand-in of this checkout.
set -euo pipefail

fresh=0
venv=""
for arg in "$@"; do
  case "$arg" in
    --fresh) fresh=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "unknown option: $arg (see --help)" >&2; exit 2 ;;
    *) venv="$arg" ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
here="$repo/scripts/sglang_cpu"
venv="${venv:-${AGENTLOAD_SGLANG_VENV:-$repo/.engine-venv/sglang}}"
version="0.5.22"
torch_version="2.13.0+cpu"
torchvision_version="0.28.0"
reqs="$here/requirements-$version.txt"
constraints="$here/constraints-$version.txt"
wheels="${AGENTLOAD_WHEELS:-/opt/wheels}"
base_python="${AGENTLOAD_BASE_PYTHON:-python3.11}"
command -v "$base_python" >/dev/null 2>&1 || base_python=python3

log() { echo "[setup-sglang-cpu] $*" >&2; }

if [[ $fresh -eq 1 && -d "$venv" ]]; then
  log "removing $venv (--fresh)"
  rm -rf "$venv"
fi

py="$venv/bin/python"
# The stamp names what was installed; a change of version or of the requirement lists reinstalls.
reqs_hash="$(cat "$reqs" "$constraints" | sha256sum | cut -c1-12)"
stamp="$venv/.agentload-sglang-cpu-$version-$reqs_hash"

install_standin() {
  # Copy (not link) the stand-in, so the venv keeps working when this checkout goes away.
  local site
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if ! diff -rq -x __pycache__ "$here/sgl_kernel" "$site/sgl_kernel" >/dev/null 2>&1; then
    rm -rf "$site/sgl_kernel"
    mkdir -p "$site/sgl_kernel"
    cp "$here/sgl_kernel/"*.py "$site/sgl_kernel/"
    log "installed the sgl_kernel stand-in into $site/sgl_kernel"
  fi
  "$py" "$here/torchvision_fix.py" apply >&2
}

if [[ -x "$py" && -f "$stamp" ]]; then
  install_standin
  # Metadata and module lookups only: importing sglang itself takes ~10 s on a 2-core machine.
  if "$py" -c "
import importlib.util as u, sys
from importlib.metadata import version
ok = version('sglang') == '$version' and version('torch') == '$torch_version'
ok = ok and all(u.find_spec(m) for m in ('sglang', 'torch', 'torchvision', 'sgl_kernel', 'transformers', 'tokenizers'))
sys.exit(0 if ok else 1)" >/dev/null 2>&1; then
    log "reusing $venv (sglang $version already installed)"
    echo "$py"
    exit 0
  fi
  log "$venv has a stamp but does not import; reinstalling"
  rm -f "$stamp"
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
extra=(${SGLANG_EXTRA_PIP_ARGS:-})

t0=$SECONDS
log "installing torch==$torch_version"
"$py" -m pip install "${pip_args[@]}" "${extra[@]}" -c "$constraints" "torch==$torch_version" >&2
log "installing sglang $version's requirements without the CUDA-only ones (about 60 s)"
"$py" -m pip install "${pip_args[@]}" "${extra[@]}" -r "$reqs" -c "$constraints" >&2
log "installing sglang==$version and torchvision==$torchvision_version without dependencies"
"$py" -m pip install "${pip_args[@]}" "${extra[@]}" --no-deps "sglang==$version" "torchvision==$torchvision_version" >&2

install_standin
SGLANG_USE_CPU_ENGINE=1 "$py" -c "
import torch, torchvision.transforms, sgl_kernel
from importlib.metadata import version
print('sglang', version('sglang'), 'torch', torch.__version__, 'torchvision', version('torchvision'),
      'sgl_kernel', sgl_kernel.__version__)
" >&2
case "$("$py" -c 'import torch; print(torch.__version__)')" in
  *+cpu) ;;
  *) log "torch in $venv is not a CPU build; refusing to stamp it"; exit 1 ;;
esac
rm -f "$venv"/.agentload-sglang-cpu-*
touch "$stamp"
log "done in $((SECONDS - t0)) s"
echo "$py"
