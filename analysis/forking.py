"""Work a read-only command hands to forked copies of itself: scoring runs beside each other, and
its figure beside the scoring (analysis/figure_process.py).

Why forks rather than a process pool: a fork costs a few milliseconds and inherits the modules the
parent has already imported and the function it runs (no pickling of code, no second interpreter
start-up of ~0.4 s of imports), which is what lets `analyze` of an 18-run test gain from a second
core at all (issue 24's `analyze` <= 1 s). Only results travel back, pickled through a pipe.

Every use falls back to doing the work in the calling process: where there is no fork, where the
process runs other threads (a fork copies only the forking thread, and whatever lock another thread
held stays held in the child), or where a child fails. A child's failure is never reported as
such: the parent does that share itself, so a user meets the error (with its traceback) exactly as
without the fork. Children end with `os._exit`: they neither flush the parent's buffered output
nor run its exit handlers or a test runner's teardown.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_SHARE = 4  # items per process below which a fork costs more than it saves (a run scores in ~15 ms)


def can_fork() -> bool:
    """True where forking is both possible and safe here: the platform forks, and this process runs
    no other thread."""
    return hasattr(os, "fork") and threading.active_count() == 1


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_all(fd: int) -> bytes:
    """Everything until the writer closes its end."""
    chunks: list[bytes] = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def read_exact(fd: int, n: int) -> bytes:
    """`n` bytes, or fewer where the writer closed its end first."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fork_child(body: Callable[[], None], close: Sequence[int] = ()) -> int:
    """Fork; the child closes the descriptors `close` (the parent's ends of its pipes), runs `body`
    and ends with `os._exit` (0 once `body` returns, 1 if it raised); the parent gets its pid. The
    output buffers are flushed first: the child inherits them and never flushes them, but they are
    kept empty."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its work is checked through the parent
        code = 1
        try:
            for fd in close:
                os.close(fd)
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def shares(n_items: int, workers: int) -> list[range]:
    """Contiguous index ranges, as even as they come, for at most `workers` processes with at least
    MIN_SHARE items each (one range where forking would not pay)."""
    n = max(1, min(workers, n_items // MIN_SHARE))
    size, extra = divmod(n_items, n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(range(start, end))
        start = end
    return out


def forked_map(func: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """`[func(x) for x in items]`, in order, the items shared among up to `workers` processes: this
    one does the first share, each other share a forked child whose results come back pickled.

    `func` must not depend on side effects in the parent (a child's are lost) and its results must
    pickle; a share whose child fails or whose results do not come back is done here instead."""
    parts = shares(len(items), workers) if can_fork() else [range(len(items))]
    if len(parts) == 1:
        return [func(x) for x in items]
    children: list[tuple[int, int, range]] = []

    def share(part: range, w: int) -> None:  # in the child
        try:
            payload = pickle.dumps([func(items[i]) for i in part], protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            payload = b""  # the parent does this share and meets the error itself
        write_all(w, payload)

    try:
        for part in parts[1:]:
            r, w = os.pipe()
            pid = fork_child(functools.partial(share, part, w), close=(r,))
            os.close(w)
            children.append((pid, r, part))
        out = [func(items[i]) for i in parts[0]]
        while children:
            pid, r, part = children.pop(0)
            out.extend(_collect(pid, r, part, func, items))
        return out
    finally:
        for pid, r, _ in children:  # the parent's own share raised: end and reap the rest
            os.close(r)
            os.waitpid(pid, 0)


def _collect(pid: int, fd: int, part: range, func: Callable[[T], R], items: Sequence[T]) -> list[R]:
    try:
        data = read_all(fd)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    try:
        results = pickle.loads(data) if data else None
    except Exception:
        results = None
    if isinstance(results, list) and len(results) == len(part):
        return results
    return [func(items[i]) for i in part]
