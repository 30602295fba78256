"""A throwaway git repository with a bare remote on disk: the fixture for labels, freezes and proofs.

Why a real bare repository: the registered half's facts (committed? pushed? when?) must come from
git itself, so tests run real git commands against a real remote, never a mock of one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

_ENV_CONFIG = ["-c", "user.name=Test Author", "-c", "user.email=author@example.org", "-c", "init.defaultBranch=main"]


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", *_ENV_CONFIG, *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {out.stderr}")
    return out.stdout.strip()


def make_repo(root: Path, object_format: str = "sha1") -> tuple[Path, Path]:
    """A working tree `root/work` (one commit on main, tracking origin/main) and its bare remote."""
    remote = root / "remote.git"
    work = root / "work"
    remote.mkdir(parents=True)
    git(remote, "init", "--bare", "-q", f"--object-format={object_format}")
    work.mkdir()
    git(work, "init", "-q", f"--object-format={object_format}")
    git(work, "config", "user.name", "Test Author")
    git(work, "config", "user.email", "author@example.org")
    (work / "README.md").write_text("fixture\n")
    git(work, "add", "README.md")
    git(work, "commit", "-q", "-m", "start")
    git(work, "branch", "-M", "main")
    git(work, "remote", "add", "origin", str(remote))
    git(work, "push", "-q", "-u", "origin", "main")
    return work, remote


def commit_file(work: Path, rel: str, text: str | bytes, message: str = "add") -> str:
    p = work / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    git(work, "add", rel)
    git(work, "commit", "-q", "-m", message)
    return git(work, "rev-parse", "HEAD")
