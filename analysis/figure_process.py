"""Reports' figures drawn by a forked process that imported matplotlib while the command scored.

Why: `analyze` of an 18-run test spent about 0.35 s importing matplotlib and 0.25 s drawing, after
about 0.45 s importing the scoring (pandas, the measures) and 0.3 s scoring: 1.25-1.3 s in all,
against issue 24's 1 s. Nothing in the figure's import depends on the scoring, and the machines this
runs on have at least two cores, so the import runs beside it: `FigureProcess.start()` forks before
the command imports its scoring; the child imports matplotlib and the Agg canvas and waits; the
parent scores, sends the child the verdict and the judged runs (pickled, through a pipe), writes
verdict.json and report.md while the child draws, and waits for the PNG. `test run` has one too:
its figures (one per test) are drawn by a process that imported matplotlib while the runs ran.

The figure is the same either way: the child runs the very `figure` function the parent would
(`analysis.reports.<family>.figure`) on the same objects. Where the child cannot be had (no
`os.fork`, or other threads run), cannot be sent its work, or reports a failure, the parent draws
the figure itself, so a user gets the figure (or the drawing's own exception and traceback) as
without the child. The child never writes to the command's output, and it ends with `os._exit`,
so it neither flushes the parent's buffered output nor runs its exit handlers.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.forking import can_fork, fork_child, read_exact, write_all

OK = b"ok"


def draw_in_process(family: str, verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Path) -> Path:
    """The family module's figure, drawn here."""
    mod = importlib.import_module(f"analysis.reports.{family}")
    return Path(mod.figure(verdict, analyzed, path))


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def _read_frame(fd: int) -> bytes | None:
    """One length-prefixed message; None at the end of the input (or a message cut short)."""
    head = read_exact(fd, 8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    body = read_exact(fd, n)
    return body if len(body) == n else None


def _child(requests: int, results: int) -> None:
    """The forked process: import the canvas, then draw each figure asked for until the input ends,
    answering each with `OK` or the failure's traceback."""
    try:
        import matplotlib.backends.backend_agg
        import matplotlib.figure  # noqa: F401
    except Exception:  # the parent draws it, and meets the error itself
        pass
    while (payload := _read_frame(requests)) is not None:
        try:
            family, verdict, analyzed, path = pickle.loads(payload)
            draw_in_process(family, verdict, analyzed, Path(path))
            reply = OK
        except BaseException:
            reply = traceback.format_exc().encode()
        write_all(results, _frame(reply))


class FigureProcess:
    """A forked child that draws a command's figures, one at a time (see the module's docstring).
    Use as a context manager, so that the child is ended and reaped however the command ends."""

    def __init__(self, pid: int, requests: int, results: int) -> None:
        self.pid = pid
        self._requests: int | None = requests
        self._results: int | None = results
        self._pending: tuple[str, Mapping[str, Any], Sequence[Any], Path] | None = None
        self._sent = False
        self.failure: str | None = None  # what the child reported, when it did not draw; it draws no more

    @classmethod
    def start(cls) -> FigureProcess | None:
        """Fork the child now, before the caller imports anything heavy (a fork copies it all) and
        before it starts threads; None where forking is impossible or unsafe here
        (analysis.forking.can_fork)."""
        if not can_fork():
            return None
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = fork_child(lambda: _child(req_r, res_w), close=(req_w, res_r))
        os.close(req_r)
        os.close(res_w)
        return cls(pid, req_w, res_r)

    def submit(self, family: str, verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Path) -> None:
        """Send the child a figure to draw; `result()` waits for it (one figure at a time)."""
        if self._pending is not None:
            raise RuntimeError("FigureProcess.submit() while a figure is pending; call result() first")
        self._pending = (family, verdict, analyzed, path)
        self._sent = False
        if self.failure is not None or self._requests is None:
            return
        try:
            payload = pickle.dumps((family, verdict, analyzed, str(path)), protocol=pickle.HIGHEST_PROTOCOL)
            write_all(self._requests, _frame(payload))
            self._sent = True
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
            self.failure = f"not sent: {type(exc).__name__}: {exc}"

    def result(self) -> Path:
        """The figure's path once drawn: by the child, or here where the child did not draw it."""
        if self._pending is None:
            raise RuntimeError("FigureProcess.result() before submit()")
        family, verdict, analyzed, path = self._pending
        self._pending = None
        if self._sent and self._results is not None:
            reply = _read_frame(self._results)
            if reply == OK:
                return path
            self.failure = (reply or b"").decode(errors="replace") or "the figure process ended without a reply"
        return draw_in_process(family, verdict, analyzed, path)

    def close(self) -> None:
        """End the child and reap it. It is idle unless a figure was sent and never waited for; it is
        stopped rather than waited on, since a process forked from this one after it (a worker
        pool's) may still hold its input open."""
        for fd in (self._requests, self._results):
            if fd is not None:
                os.close(fd)
        self._requests = self._results = None
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0

    def __enter__(self) -> FigureProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
