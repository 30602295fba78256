"""A real engine's own classes in a subprocess of the engine's venv, spoken to in JSON lines.

Why a subprocess: vLLM and SGLang pin their own torch and hundreds of packages; the harness must
never import either (tests/unit/test_layout.py would not catch a transitive import, so the rule is
structural: the driver scripts under sim2real/drivers/ import only the standard library
and their engine, and run only under that engine's interpreter).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from harness.errors import EngineError

DRIVERS = Path(__file__).resolve().parent / "drivers"
ENV_VARS = {"vllm": "AGENTLOAD_VLLM_PYTHON", "sglang": "AGENTLOAD_SGLANG_PYTHON"}
DRIVER_FILES = {"vllm": "vllm_driver.py", "sglang": "sglang_driver.py"}


class EngineProcError(EngineError):
    """The engine driver failed: no interpreter, a crash, or an error reply."""


def engine_python(engine: str, python: str | None = None) -> str:
    """The engine venv's interpreter: the explicit one, else $AGENTLOAD_<ENGINE>_PYTHON."""
    if engine not in ENV_VARS:
        raise EngineProcError(f"engine {engine!r}: expected one of {sorted(ENV_VARS)}")
    py = python or os.environ.get(ENV_VARS[engine])
    if not py:
        raise EngineProcError(f"{ENV_VARS[engine]} is unset: point it at the {engine} engine venv's python")
    if not Path(py).exists():
        raise EngineProcError(f"{ENV_VARS[engine]}={py}: no such interpreter")
    return py


class EngineProc:
    """One driver process; `call(op, **fields)` sends a request and returns its reply."""

    def __init__(
        self, engine: str, python: str | None = None, *, env: dict[str, str] | None = None, nice: int = 10
    ) -> None:
        self.engine = engine
        py = engine_python(engine, python)
        argv = [py, str(DRIVERS / DRIVER_FILES[engine])]
        if nice and os.name == "posix":
            argv = ["nice", "-n", str(nice), *argv]
        full_env = {**os.environ, **(env or {})}
        self._stderr: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-200]

    def stderr_tail(self, n: int = 30) -> str:
        return "".join(self._stderr[-n:])

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise EngineProcError(
                f"{self.engine} driver died ({exc}); its stderr ends:\n{self.stderr_tail()}"
            ) from None
        if not line:
            self.proc.wait(timeout=10)
            raise EngineProcError(
                f"{self.engine} driver exited with status {self.proc.returncode}; its stderr "
                f"ends:\n{self.stderr_tail()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise EngineProcError(f"{self.engine} driver: {op} failed: {reply['error']}\n{reply.get('trace', '')}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=15)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> EngineProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
