"""Git facts, asked of git itself.

Why this module: a registration's label (pre-registered / registered / exploratory), a
prediction's blindness and a job's right to run all rest on facts about commits: is this file
committed, in which commit, is the tree clean, does the remote branch contain that commit, when
was that checked. Those facts must come from git's own commands, never from a user's word or a
config field, so every caller in prereg/, slurm/ and provenance/ goes through this one thin
wrapper. It runs `git` as a subprocess (no library that could disagree with the git a reviewer
runs) and raises `GitError` with the command and git's message when git refuses.

The remote is whatever git remote the repository names (a bare repository on disk in tests, any
server in real use); nothing here assumes a hosting service.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.errors import GitError

__all__ = ["GitError", "RemoteCheck", "Repo"]


@dataclass(frozen=True)
class RemoteCheck:
    """The answer to "does remote/branch contain this commit", with when it was asked."""

    remote: str
    branch: str
    url: str
    remote_head: str | None
    contains: bool
    checked_at: str  # UTC ISO-8601


# A full object id (SHA-1 or SHA-256), optionally peeled to its commit: a name whose meaning cannot
# change, unlike a branch, a tag or HEAD.
_FULL_ID = re.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})(?:\^\{commit\})?")
# Yes/no questions whose "yes" about full ids is a fact of the commits themselves (an id is the hash
# of a commit's content and its parents'): the commit is stored, one commit descends from another.
# A "no" is not kept: a fetch can bring in a commit that was missing.
_STABLE_YES = (("cat-file", "-e"), ("merge-base", "--is-ancestor"))
# Answers kept for this process, by repository path and question. Why: `status` and the verifier
# ask the same few questions once per run (18 runs of a test: ~90 git processes, ~0.3 s).
_KNOWN: dict[tuple[str, ...], object] = {}


def _stable(args: tuple[str, ...], n_opts: int) -> bool:
    return all(_FULL_ID.fullmatch(a) for a in args[n_opts:])


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Repo:
    """A git working tree (or a bare repository) at `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # -- plumbing ---------------------------------------------------------------------------
    def git(self, *args: str, check: bool = True, input: bytes | None = None) -> str:
        return self.git_bytes(*args, check=check, input=input).decode("utf-8", "replace").strip()

    def git_bytes(self, *args: str, check: bool = True, input: bytes | None = None) -> bytes:
        cmd = ["git", "-C", str(self.path), *args]
        try:
            out = subprocess.run(cmd, capture_output=True, input=input, timeout=120)
        except FileNotFoundError as exc:  # pragma: no cover - git missing entirely
            raise GitError("git is not installed; install git to register, freeze or verify") from exc
        if check and out.returncode != 0:
            msg = out.stderr.decode("utf-8", "replace").strip() or out.stdout.decode("utf-8", "replace").strip()
            raise GitError(f"`git {' '.join(args)}` failed in {self.path}: {msg}")
        return out.stdout

    def ok(self, *args: str) -> bool:
        """True when the git command exits 0 (for yes/no questions such as is-ancestor). A "yes" to a
        question in `_STABLE_YES` about full ids is asked of git once per process."""
        key = (str(self.path), *args)
        if key in _KNOWN:
            return True
        yes = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, timeout=120).returncode == 0
        if yes and args[:2] in _STABLE_YES and _stable(args, 2):
            _KNOWN[key] = True
        return yes

    # -- where am I -------------------------------------------------------------------------
    @classmethod
    def containing(cls, path: str | Path) -> Repo:
        """The working tree that holds `path` (a file or folder); GitError outside any."""
        p = Path(path).resolve()
        start = p if p.is_dir() else p.parent
        top = Repo(start).git("rev-parse", "--show-toplevel")
        return cls(top)

    def relpath(self, path: str | Path) -> str:
        """`path` relative to the tree's top, with forward slashes (git's own spelling)."""
        return Path(path).resolve().relative_to(self.path.resolve()).as_posix()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def object_format(self) -> str:
        """'sha1' or 'sha256': the hash git names objects with in this repository."""
        out = self.git("rev-parse", "--show-object-format", check=False)
        return out or "sha1"

    # -- what is committed ------------------------------------------------------------------
    def is_clean(self, paths: list[str] | None = None) -> bool:
        """No staged or unstaged change to tracked files (and no untracked file under `paths`)."""
        args = ["status", "--porcelain"]
        if paths is None:
            args.append("--untracked-files=no")
        else:
            args += ["--untracked-files=all", "--", *paths]
        return self.git(*args) == ""

    def is_tracked(self, path: str) -> bool:
        return self.ok("ls-files", "--error-unmatch", "--", path)

    def file_state(self, path: str) -> str:
        """'untracked', 'modified' (tracked but differs from HEAD or the index) or 'committed'."""
        if not self.is_tracked(path):
            return "untracked"
        return "committed" if self.git("status", "--porcelain", "--", path) == "" else "modified"

    def last_commit_of(self, path: str, rev: str = "HEAD") -> str | None:
        """The newest commit at or before `rev` that changed `path` (None if it never existed)."""
        out = self.git("log", "-n", "1", "--format=%H", rev, "--", path)
        return out or None

    def blob_at(self, rev: str, path: str) -> bytes:
        """The committed bytes of `path` at `rev` (what a commit or tag really holds)."""
        return self.git_bytes("show", f"{rev}:{path}")

    def commit_time(self, rev: str) -> str:
        """Committer time of `rev` in UTC ISO-8601 (a claim recorded by the committer's clock)."""
        ts = int(self.git("show", "-s", "--format=%ct", rev))
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")

    def is_ancestor(self, ancestor: str, rev: str) -> bool:
        return self.ok("merge-base", "--is-ancestor", ancestor, rev)

    def changed_paths(self, a: str, b: str) -> list[str]:
        """Paths that differ between two commits (asked of git once per process for two full ids:
        the trees of two commits never change)."""
        key = (str(self.path), "diff", "--name-only", a, b)
        known = _KNOWN.get(key)
        if isinstance(known, tuple):
            return list(known)
        out = self.git("diff", "--name-only", a, b)
        paths = [line for line in out.splitlines() if line]
        if _stable((a, b), 0):
            _KNOWN[key] = tuple(paths)
        return paths

    def resolve(self, rev: str) -> str:
        return self.git("rev-parse", "--verify", f"{rev}^{{commit}}")

    # -- the remote -------------------------------------------------------------------------
    def default_remote(self) -> tuple[str, str]:
        """(remote, branch) the current branch tracks, else ('origin', current branch)."""
        up = self.git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", check=False)
        if up and "/" in up:
            remote, branch = up.split("/", 1)
            return remote, branch
        return "origin", self.git("rev-parse", "--abbrev-ref", "HEAD")

    def remote_url(self, remote: str) -> str:
        return self.git("remote", "get-url", remote)

    def remote_contains(self, commit: str, remote: str | None = None, branch: str | None = None) -> RemoteCheck:
        """Ask the remote itself (a fresh fetch of its branch) whether it contains `commit`.

        A local remote-tracking ref can be stale or forged by hand, so the branch is fetched
        first; the answer carries the remote head seen and the UTC time it was asked.
        """
        d_remote, d_branch = self.default_remote()
        remote = remote or d_remote
        branch = branch or d_branch
        url = self.remote_url(remote)
        checked_at = utc_now()
        line = self.git("ls-remote", remote, f"refs/heads/{branch}")
        if not line:
            return RemoteCheck(remote, branch, url, None, False, checked_at)
        remote_head = line.split()[0]
        self.git("fetch", "--quiet", remote, f"refs/heads/{branch}")
        contains = self.is_ancestor(commit, remote_head)
        return RemoteCheck(remote, branch, url, remote_head, contains, checked_at)

    def remote_tag(self, tag: str, remote: str | None = None) -> str | None:
        """The object id the remote holds for `refs/tags/<tag>` (None when it has no such tag)."""
        remote = remote or self.default_remote()[0]
        line = self.git("ls-remote", remote, f"refs/tags/{tag}")
        return line.split()[0] if line else None

    # -- objects, tags and history (freezes and proofs) -------------------------------------
    def rev(self, rev: str) -> str:
        """The object id `rev` names, without peeling (a tag name gives the tag object's id)."""
        return self.git("rev-parse", "--verify", rev)

    def object_type(self, oid: str) -> str:
        """'blob', 'tree', 'commit' or 'tag'."""
        return self.git("cat-file", "-t", oid)

    def object_bytes(self, oid: str) -> tuple[str, bytes]:
        """(type, content) of a stored object: the exact bytes its id is the hash of (after the header)."""
        kind = self.object_type(oid)
        return kind, self.git_bytes("cat-file", kind, oid)

    def tree_path_ids(self, commit: str, path: str) -> list[tuple[str, str]]:
        """[(tree path, tree id)] from the root tree of `commit` down to the folder holding `path`."""
        parts = path.split("/")
        out = [("", self.git("rev-parse", f"{commit}^{{tree}}"))]
        for i in range(1, len(parts)):
            sub = "/".join(parts[:i])
            out.append((sub, self.git("rev-parse", f"{commit}:{sub}")))
        return out

    def blob_id(self, rev: str, path: str) -> str:
        return self.git("rev-parse", f"{rev}:{path}")

    def local_tag(self, tag: str) -> str | None:
        """The id of the local annotated tag object `refs/tags/<tag>` (None if there is none)."""
        out = self.git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}", check=False)
        return out or None

    def tag_target(self, tag: str) -> str:
        """The commit a tag points to."""
        return self.git("rev-parse", "--verify", f"refs/tags/{tag}^{{commit}}")

    def tag_message(self, tag: str) -> str:
        """The annotated tag's message (git's own stored text, not a re-formatted one)."""
        _, content = self.object_bytes(self.rev(f"refs/tags/{tag}"))
        _head, _, msg = content.partition(b"\n\n")
        return msg.decode("utf-8", "replace")

    def tag_time(self, tag: str) -> str:
        """Tagger time in UTC ISO-8601 (like a commit time, a claim of the tagger's clock)."""
        ts = self.git("for-each-ref", "--format=%(taggerdate:unix)", f"refs/tags/{tag}")
        return datetime.fromtimestamp(int(ts), UTC).isoformat(timespec="seconds")

    def commits_touching(self, path: str, after: str, rev: str = "HEAD") -> list[tuple[str, str]]:
        """[(commit, UTC committer time)] of commits in after..rev that changed `path`, oldest first."""
        out = self.git("log", "--reverse", "--format=%H %ct", f"{after}..{rev}", "--", path)
        rows = []
        for line in out.splitlines():
            oid, ts = line.split()
            rows.append((oid, datetime.fromtimestamp(int(ts), UTC).isoformat(timespec="seconds")))
        return rows

    def push(self, remote: str, *refspecs: str) -> None:
        self.git("push", "--quiet", remote, *refspecs)
