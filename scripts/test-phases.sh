#!/usr/bin/env bash
# The whole suite in three phases, so that the tests that mostly wait overlap with those that compute:
#
#   1. the `quiet` tests alone (they measure a real engine's speed and need the machine to themselves:
#      the CPU trap test's host scale, the speed pin);
#   2. the SLURM tests (`slurm` marker: the local cluster's jobs, a 4-minute TIMEOUT job, the tutorial's
#      submission), mostly waiting on the scheduler, and the `background` ones (the tutorial's arms on
#      fresh real servers, the GPU campaign page's clone), in a second pytest session in the background ...
#   3. ... while everything else runs in the foreground: unit, pipeline, then the real-engine
#      integration tests (their servers boot once, in the background, when this session starts).
#
# Each session prints its own summary; the SLURM session's output is kept in a log and printed when
# it ends. The exit status is non-zero if any session failed (pytest's 5, "no tests collected",
# counts as success: e.g. AGENTLOAD_SKIP_VLLM=1 leaves no quiet test). Called by scripts/test.sh with
# the pytest command line to use; AGENTLOAD_SERIAL=1 scripts/test.sh runs one session instead.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=("$@")
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/agentload-tests.XXXXXX")

echo "== phase 1: the quiet tests, alone"
"${PYTEST[@]}" -m quiet tests/integration
rc_quiet=$?

echo "== phase 2: the SLURM tests in the background (log: $LOGDIR/slurm.log), and everything else"
"${PYTEST[@]}" -m "(slurm or background) and not quiet" -p no:cacheprovider tests/integration >"$LOGDIR/slurm.log" 2>&1 &
slurm_pid=$!
"${PYTEST[@]}" -m "not slurm and not background and not quiet" tests/unit tests/pipeline tests/integration
rc_rest=$?
if kill -0 "$slurm_pid" 2>/dev/null; then
  echo "== waiting for the SLURM tests ($LOGDIR/slurm.log)"
fi
wait "$slurm_pid"
rc_slurm=$?
echo "== the SLURM tests' session"
cat "$LOGDIR/slurm.log"

echo "== phases: quiet rc=$rc_quiet, SLURM rc=$rc_slurm, the rest rc=$rc_rest"
if ok "$rc_quiet" && ok "$rc_slurm" && ok "$rc_rest"; then
  exit 0
fi
exit 1
