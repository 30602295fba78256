#!/usr/bin/env bash
# The whole suite, arranged so that what mostly waits (installs, SLURM jobs, engine servers) overlaps
# with what computes:
#
#   0. Chromium from the Debian packages (in the foreground: the SLURM cluster's own apt-get comes
#      later, and two apt-gets at once would fight over dpkg's lock), while the real engines' install
#      (scripts/ci-engine-tests.sh --print-env) starts in the background: minutes of downloading and
#      unpacking on a fresh machine that no unit, pipeline or SLURM-only test needs;
#   1. four pytest sessions side by side: the SLURM tests (`slurm` marker: the local cluster's jobs, a
#      4-minute TIMEOUT job, the tutorial's submission), mostly waiting on the scheduler; the
#      `background` ones (the tutorial's arms on fresh real servers, the GPU campaign page's clone),
#      mostly waiting on their servers; the other integration tests (the shared real-engine servers
#      and the emulator), each in the background with its own log, while the unit and pipeline tests,
#      which compute, run in the foreground. A test that needs an engine (marked vllm, sglang or
#      engine_venv) waits for the install to end, its file moved to the end of its session; the
#      shared engine servers boot as soon as the install has ended (tests/support/pending_setup.py,
#      AGENTLOAD_SETUP_ENV). The SLURM tests stay in one session: the one-node cluster runs two
#      1-CPU jobs at a time, and two sessions' jobs would queue behind each other;
#   2. the `quiet` tests alone, last (they measure a real engine's speed and need the machine to
#      themselves: the CPU trap test's host scale, the speed pin).
#
# Each session prints its own summary; the SLURM session's output is kept in a log and printed when
# it ends, the install's log when it failed. The exit status is non-zero if the install or any session
# failed (pytest's 5, "no tests collected", counts as success: e.g. AGENTLOAD_SKIP_VLLM=1 leaves no
# quiet test). Called by scripts/test.sh with the pytest command line to use; AGENTLOAD_SERIAL=1
# scripts/test.sh runs one session instead.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=("$@")
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/agentload-tests.XXXXXX")
start=$SECONDS
stamp() { echo "== [$(((SECONDS - start) / 60))m$(((SECONDS - start) % 60))s] $*"; }

# --- phase 0: the engines' install in the background, Chromium in the foreground
ENV_FILE="$LOGDIR/engine-env.sh"
rc_install=0
if [ "${AGENTLOAD_SKIP_VLLM:-0}" != "1" ] || [ "${AGENTLOAD_SKIP_SGLANG:-0}" != "1" ]; then
  stamp "phase 0: installing the real engines in the background (log: $ENV_FILE.log)"
  # The .rc file comes last: tests/support/pending_setup.py reads the exports only once it exists.
  (
    scripts/ci-engine-tests.sh --print-env >"$ENV_FILE.tmp" 2>"$ENV_FILE.log"
    echo $? >"$ENV_FILE.rc.tmp"
    mv "$ENV_FILE.tmp" "$ENV_FILE"
    mv "$ENV_FILE.rc.tmp" "$ENV_FILE.rc"
  ) &
  install_pid=$!
  export AGENTLOAD_SETUP_ENV="$ENV_FILE"
else
  install_pid=""
fi
if [ "${AGENTLOAD_SKIP_BROWSER:-0}" != "1" ]; then
  # Headless Chromium for tests/pipeline/test_report_world.py's browser tests; exports AGENTLOAD_CHROMIUM.
  if ! chromium_env=$(scripts/setup-chromium.sh --print-env); then
    echo "Chromium could not be installed (scripts/setup-chromium.sh); AGENTLOAD_SKIP_BROWSER=1 skips the browser tests" >&2
    [ -n "$install_pid" ] && wait "$install_pid"
    exit 1
  fi
  eval "$chromium_env"
fi

# --- phase 1: four pytest sessions side by side, three of them in the background with a log each
declare -A pids=() rcs=()
background() {  # name, then the session's pytest arguments
  local name=$1
  shift
  "${PYTEST[@]}" -p no:cacheprovider "$@" >"$LOGDIR/$name.log" 2>&1 &
  pids[$name]=$!
}
stamp "phase 1: the SLURM tests, the background tests and the integration tests in the background (logs: $LOGDIR), unit and pipeline here"
background slurm -m "slurm and not quiet" tests/integration
background waiting -m "background and not slurm and not quiet" tests/integration
background integration -m "not slurm and not background and not quiet" tests/integration
"${PYTEST[@]}" -m "not slurm and not background and not quiet" tests/unit tests/pipeline
rc_here=$?
for name in integration waiting slurm; do
  if kill -0 "${pids[$name]}" 2>/dev/null; then
    stamp "waiting for the $name session ($LOGDIR/$name.log)"
  fi
  wait "${pids[$name]}"
  rcs[$name]=$?
  stamp "the $name session (rc ${rcs[$name]}):"
  cat "$LOGDIR/$name.log"
done

# --- phase 2: the quiet tests, alone
if [ -n "$install_pid" ]; then
  wait "$install_pid"
  rc_install=$(cat "$ENV_FILE.rc" 2>/dev/null || echo 1)
  if [ "$rc_install" != "0" ]; then
    echo "== the engines' install failed (exit status $rc_install); its log:" >&2
    tail -n 40 "$ENV_FILE.log" >&2
  else
    # shellcheck disable=SC1090
    source "$ENV_FILE"
  fi
  unset AGENTLOAD_SETUP_ENV
fi
stamp "phase 2: the quiet tests, alone"
"${PYTEST[@]}" -m quiet tests/integration
rc_quiet=$?

stamp "phases: install rc=$rc_install, unit and pipeline rc=$rc_here, integration rc=${rcs[integration]}, background rc=${rcs[waiting]}, SLURM rc=${rcs[slurm]}, quiet rc=$rc_quiet"
if [ "$rc_install" = "0" ] && ok "$rc_here" && ok "${rcs[integration]}" && ok "${rcs[waiting]}" && ok "${rcs[slurm]}" && ok "$rc_quiet"; then
  exit 0
fi
exit 1
