"""The real engines' install, still running in the background while the first tests run.

Installing vLLM and SGLang on a fresh machine takes minutes of mostly downloading and unpacking,
while the unit and pipeline tests (and the SLURM jobs) need neither engine; scripts/test-phases.sh
therefore starts the install and the test sessions together. It names, in AGENTLOAD_SETUP_ENV, the
file where `scripts/ci-engine-tests.sh --print-env` leaves its `export` lines (the engines' Pythons,
the tiny model, the compile cache); `<file>.rc` appears last, holding the install's exit status, and
`<file>.log` holds its output.

A test that needs an engine venv (marked `vllm` or `sglang`) waits for that file before it starts
(tests/conftest.py); every other test's start looks for it without waiting, so that the session's
shared engine servers (tests/integration/conftest.py) begin to boot as soon as the engines exist.
Without AGENTLOAD_SETUP_ENV (a plain pytest run, scripts/test.sh with arguments) nothing here acts:
the environment is what the caller exported.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

ENV_VAR = "AGENTLOAD_SETUP_ENV"
# Longest wait for the install (a fresh machine takes ~5 min; pip retries on a slow mirror can
# take much longer): past it the waiting test fails and names the log.
WAIT_S = float(os.environ.get("AGENTLOAD_SETUP_WAIT_S", "2700"))
POLL_S = 2.0

_loaded: list[str] = []  # the file whose exports are in os.environ (at most one)


class SetupFailed(RuntimeError):
    """The background install ended without the environment the test needs, or never ended."""


def pending() -> bool:
    """True while an install was announced and its environment is not loaded yet."""
    path = os.environ.get(ENV_VAR)
    return bool(path) and path not in _loaded


def parse_exports(text: str) -> dict[str, str]:
    """The `export NAME=value` lines (values quoted by bash's printf %q) of a --print-env output.

    Anything else on a line is an error: the file comes from our own script, and a line we cannot
    read would otherwise leave an engine silently unset (its tests then skip instead of running).
    """
    env: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        words = shlex.split(line)
        if len(words) != 2 or words[0] != "export" or "=" not in words[1]:
            raise SetupFailed(f"line {n} of the install's environment is not `export NAME=value`: {line!r}")
        name, _, value = words[1].partition("=")
        env[name] = value
    return env


def load(*, wait: bool) -> bool:
    """Load the install's environment into os.environ once it is there; True when it is loaded.

    wait=False looks once and returns False while the install runs (or when it failed: the tests
    that need it say so when they wait). wait=True blocks until the install ends and raises
    SetupFailed, with the log's tail, if it failed or ran past WAIT_S.
    """
    path = os.environ.get(ENV_VAR)
    if not path or path in _loaded:
        return True
    env_file, rc_file = Path(path), Path(path + ".rc")
    deadline = time.monotonic() + WAIT_S
    told = False
    while not rc_file.exists():
        if not wait:
            return False
        if time.monotonic() > deadline:
            raise SetupFailed(f"the engine install did not end within {WAIT_S:.0f} s ({ENV_VAR}); {_tail(path)}")
        if not told:
            print(f"\n[setup] waiting for the engine install to end (log: {path}.log)", file=sys.__stderr__, flush=True)
            told = True
        time.sleep(POLL_S)
    rc = rc_file.read_text(encoding="utf-8").strip()
    if rc != "0":
        if not wait:
            return False
        raise SetupFailed(f"the engine install failed (exit status {rc or '?'}); {_tail(path)}")
    os.environ.update(parse_exports(env_file.read_text(encoding="utf-8")))
    _loaded.append(path)
    if told:
        print("[setup] the engine install ended; its environment is loaded", file=sys.__stderr__, flush=True)
    return True


def _tail(path: str, lines: int = 20) -> str:
    log = Path(path + ".log")
    if not log.exists():
        return f"no log at {log}"
    text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return f"the last {len(text)} lines of {log}:\n" + "\n".join(text)
