"""What a record that may be committed or published says about the host that wrote it: nothing.

Why: a freeze record is committed to the repository (prereg/freezes/) and a submission manifest
travels with a test directory; a path like /work/remotes/agentload.git or /home/alice/.venv/bin/…
is true of one machine only, tells a reader elsewhere nothing they can check, and leaks the
writer's file system. So a remote on the local file system (a bare repository, file://) is recorded
by its name, the basename of its path; a network remote keeps its URL, without credentials; and a
command line names the program by its basename and the repository's files by their repository
paths.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit, urlunsplit

_NETWORK_SCHEMES = ("http", "https", "ssh", "git", "ftp", "ftps")


def remote_label(url: str | None) -> str | None:
    """A remote's URL as a record keeps it: a local one (a path, file://) by the basename of its
    path; a network one as is, less any user name or password; `user@host:path` (scp-like ssh) as is."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.scheme in _NETWORK_SCHEMES:
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    if parts.scheme == "file":
        return PurePosixPath(parts.path.rstrip("/")).name or url
    if ":" in url and not url.startswith(("/", ".")) and "@" in url.split(":", 1)[0]:
        return url  # scp-like ssh (git@host:owner/repo.git): not a local path
    return PurePosixPath(url.rstrip("/")).name or url


def portable_argv(argv: Sequence[str], root: str | os.PathLike[str]) -> list[str]:
    """A command line as a record keeps it: the program by its basename, an absolute path inside
    the repository `root` by its repository path, one outside it by its basename."""
    base = Path(root).resolve()

    def path(text: str) -> str:
        if not os.path.isabs(text):
            return text
        p = Path(text)
        try:
            return p.resolve().relative_to(base).as_posix()
        except ValueError:
            return p.name or text

    out = []
    for i, arg in enumerate(argv):
        if i == 0:
            out.append(Path(arg).name or arg)
        elif arg.startswith("--") and "=" in arg:  # --option=/a/path
            opt, _, value = arg.partition("=")
            out.append(f"{opt}={path(value)}")
        else:
            out.append(path(arg))
    return out
