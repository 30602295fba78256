"""A read-only repository made of proof folders' raw git objects, for a test's evidence bundle.

Why: a reviewer who clones the project has neither the repository a registered test was run from
(its registration commit, its freeze tag; tags are not always cloned) nor its history. The bundle
keeps, for the registration at its commit and for each frozen prediction at its tag, the raw
objects `provenance prove` stored (blob, trees on the path, commit, tag). Those objects are a
small piece of the original object database, and each can be re-identified by hashing it. This
class answers the questions the timeline and the whole-test verification ask of git (a file's
bytes at a commit, a commit's time, a tag's target and message, whether one commit descends from
another, which paths two commits differ in) from those objects alone, so `review.verify.verify_test`
runs unchanged on a bundle.

Every object is admitted only if its id recomputes from its bytes (`proofcheck.object_id`); a
question that needs an object the bundle does not hold raises `GitError` (the callers report it
as a break or as unknown, never as a pass). Where an answer can only be partial it errs toward a
break: `changed_paths` names a folder whose trees differ but are not stored as changed as a whole.
History after a commit is not in the bundle: `history_known` is False and `commits_touching`
answers nothing, which the verifier reports as not checked.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson

from harness.errors import GitError
from provenance.git import Repo
from provenance.proofcheck import _headers, object_id, parse_tree

__all__ = ["ProofRepo"]


class ProofRepo(Repo):
    """Git's answers from stored proof objects; `path` is the folder holding the files' copies at
    their repository-relative paths (the bundle's `repo/`), standing for the work tree."""

    #: The bundle holds no history after its commits: later edits and errata cannot be listed.
    history_known = False

    def __init__(self, path: str | Path, proof_dirs: list[Path]) -> None:
        super().__init__(path)
        self._objects: dict[str, tuple[str, bytes]] = {}
        self._tags: dict[str, str] = {}
        self._format: str | None = None
        self.rejected: list[str] = []
        for d in proof_dirs:
            self._load(d)

    def _load(self, folder: Path) -> None:
        try:
            man = orjson.loads((folder / "proof.json").read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            self.rejected.append(f"{folder}: proof.json unreadable ({exc})")
            return
        fmt = str(man.get("object_format"))
        if self._format is None:
            self._format = fmt
        elif fmt != self._format:
            self.rejected.append(f"{folder}: object format {fmt}, the others' is {self._format}")
            return
        for oid, kind in (man.get("objects") or {}).items():
            try:
                content = (folder / "objects" / oid).read_bytes()
                ok = object_id(kind, content, fmt) == oid
            except (OSError, KeyError):
                ok = False
            if ok:
                self._objects[oid] = (kind, content)
            else:
                self.rejected.append(f"{folder.name}: object {oid[:12]} missing or not hashing to its id")
        tag = man.get("tag")
        if isinstance(tag, dict) and tag.get("name") and tag.get("id") in self._objects:
            self._tags[str(tag["name"])] = str(tag["id"])

    # -- nothing is asked of a git binary -------------------------------------------------------
    def git_bytes(self, *args: str, check: bool = True, input: bytes | None = None) -> bytes:
        raise GitError(
            f"git {' '.join(args)}: an evidence bundle holds no repository, only its proofs' objects; this question "
            "cannot be answered from them"
        )

    # -- objects ---------------------------------------------------------------------------------
    def _get(self, oid: str, kind: str | None = None) -> bytes:
        got = self._objects.get(oid)
        if got is None:
            raise GitError(f"object {oid[:12]} is not among the bundle's proof objects")
        if kind is not None and got[0] != kind:
            raise GitError(f"object {oid[:12]} is a {got[0]}, not a {kind}")
        return got[1]

    def object_format(self) -> str:
        if self._format is None:
            raise GitError("the bundle holds no proof objects")
        return self._format

    def object_type(self, oid: str) -> str:
        self._get(oid)
        return self._objects[oid][0]

    def object_bytes(self, oid: str) -> tuple[str, bytes]:
        return self.object_type(oid), self._get(oid)

    def _commit_id(self, rev: str) -> str:
        if rev in self._tags:
            return self.tag_target(rev)
        self._get(rev, "commit")
        return rev

    def _headers_of(self, oid: str, kind: str) -> tuple[dict[str, str], str]:
        return _headers(self._get(oid, kind))

    def parents(self, commit: str) -> list[str]:
        content = self._get(commit, "commit")
        head = content.partition(b"\n\n")[0].decode("utf-8", "replace")
        return [line.split(" ", 1)[1] for line in head.splitlines() if line.startswith("parent ")]

    def _tree(self, oid: str) -> dict[bytes, tuple[bytes, str]]:
        return parse_tree(self._get(oid, "tree"), self.object_format())

    def _root(self, commit: str) -> str:
        return self._headers_of(self._commit_id(commit), "commit")[0]["tree"]

    def blob_id(self, rev: str, path: str) -> str:
        oid = self._root(rev)
        parts = path.split("/")
        for i, part in enumerate(parts):
            ent = self._tree(oid).get(part.encode())
            if ent is None:
                raise GitError(f"{path}: {'/'.join(parts[: i + 1])} is not in commit {rev[:12]}")
            oid = ent[1]
        return oid

    def blob_at(self, rev: str, path: str) -> bytes:
        return self._get(self.blob_id(rev, path), "blob")

    def commit_time(self, rev: str) -> str:
        hdr, _ = self._headers_of(self._commit_id(rev), "commit")
        ts = int(hdr["committer"].rsplit(" ", 2)[-2])
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")

    def resolve(self, rev: str) -> str:
        return self._commit_id(rev)

    # -- tags ------------------------------------------------------------------------------------
    def local_tag(self, tag: str) -> str | None:
        return self._tags.get(tag)

    def rev(self, rev: str) -> str:
        name = rev.removeprefix("refs/tags/")
        if name in self._tags:
            return self._tags[name]
        self._get(rev)
        return rev

    def tag_target(self, tag: str) -> str:
        tid = self._tags.get(tag)
        if tid is None:
            raise GitError(f"tag {tag!r}: no proof in the bundle holds it")
        return self._headers_of(tid, "tag")[0]["object"]

    def tag_message(self, tag: str) -> str:
        tid = self._tags.get(tag)
        if tid is None:
            raise GitError(f"tag {tag!r}: no proof in the bundle holds it")
        return self._headers_of(tid, "tag")[1]

    def tag_time(self, tag: str) -> str:
        tid = self._tags.get(tag)
        if tid is None:
            raise GitError(f"tag {tag!r}: no proof in the bundle holds it")
        ts = int(self._headers_of(tid, "tag")[0]["tagger"].rsplit(" ", 2)[-2])
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")

    # -- history ---------------------------------------------------------------------------------
    def last_commit_of(self, path: str, rev: str = "HEAD") -> str | None:
        return None  # no history: a record must name its commit

    def commits_touching(self, path: str, after: str, rev: str = "HEAD") -> list[tuple[str, str]]:
        return []  # not known (history_known is False): the verifier says it did not check

    def is_ancestor(self, ancestor: str, rev: str) -> bool:
        """Walk the parent lines of stored commits from `rev`; a commit the bundle lacks on the way
        is a GitError (unknown), not a no."""
        seen, todo = set(), [rev]
        while todo:
            c = todo.pop()
            if c == ancestor:
                return True
            if c in seen:
                continue
            seen.add(c)
            if c not in self._objects:
                raise GitError(
                    f"commit {c[:12]} (between {ancestor[:12]} and {rev[:12]}) is not in the bundle: ancestry unknown"
                )
            todo += self.parents(c)
        return False

    def changed_paths(self, a: str, b: str) -> list[str]:
        """Paths that differ between two commits' stored trees; a differing folder whose trees are
        not both stored is named as a whole (`folder/`), so it reads as changed, never as unchanged."""
        out: list[str] = []
        self._diff(self._root(a), self._root(b), "", out)
        return sorted(out)

    def _diff(self, ta: str | None, tb: str | None, prefix: str, out: list[str]) -> None:
        if ta == tb:
            return
        try:
            ea = self._tree(ta) if ta is not None else {}
            eb = self._tree(tb) if tb is not None else {}
        except GitError:
            out.append(prefix or "/")
            return
        for name in sorted(set(ea) | set(eb)):
            xa, xb = ea.get(name), eb.get(name)
            if xa == xb:
                continue
            path = prefix + name.decode("utf-8", "replace")
            tree_a = xa is not None and xa[0] == b"40000"
            tree_b = xb is not None and xb[0] == b"40000"
            if (tree_a or xa is None) and (tree_b or xb is None):
                self._diff(xa[1] if xa else None, xb[1] if xb else None, path + "/", out)
            else:
                out.append(path)
