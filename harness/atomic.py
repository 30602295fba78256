"""Write a file so that a reader sees either the old bytes or the new ones, never half of them.

Every record a verdict depends on (meta.json, a plan, a manifest, an accounting export, the Parquet
tables a run is compacted to) is written this way, so a job killed mid-write leaves the previous
version intact and a concurrent reader never parses a torn file. The temporary file sits beside the
target (same file system, so the rename is atomic) and is named by the writing process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_path(path: Path) -> Path:
    """Where a writer puts the new bytes before the rename: hidden, beside the target, per process."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextmanager
def replacing(path: str | os.PathLike[str], *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path` (parents made as needed).

    A failure inside the block removes the temporary file and leaves `path` as it was. `fsync`
    flushes the new file to disk first (for records a crash must not lose)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> Path:
    """Replace `path` with `data` atomically; returns the path."""
    with replacing(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, fsync: bool = False) -> Path:
    """Replace `path` with UTF-8 `text` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], object], *, fsync: bool = False) -> Path:
    """Replace `path` with whatever `writer(tmp)` writes to the temporary path (a Parquet or CSV writer)."""
    with replacing(path, fsync=fsync) as tmp:
        writer(tmp)
    return Path(path)
