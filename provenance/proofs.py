"""Proofs that a file is unchanged since its commit: the raw git objects that link its bytes to a
commit (and to an annotated tag), stored so that anyone can re-check them without git.

Why raw objects: a git object's id is the hash of its own bytes, and each object names the next
by id (blob in a tree, trees up to the root tree, the root tree in the commit, the commit in the
tag). Storing exactly those bytes lets a reviewer recompute every id and check every link
(`provenance.proofcheck`, stdlib only, copied into each proof as verify_proof.py), so the claim
"this registration / prediction file is what commit C and tag T hold" rests on hashes, not on
this tool. A proof says nothing about *when* the commit reached the remote; the freeze record or
the submission manifest carries that (unsigned) fact, and the proof keeps a copy of it.

Layout of a proof folder:

    proof.json          what is proven: path, file SHA-256, object format, blob, trees, commit, tag
    objects/<id>        each object's raw content (the bytes after git's `<type> <size>\\0` header)
    verify_proof.py     the standalone verifier
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from harness.errors import ConfigError
from provenance.git import Repo, utc_now
from provenance.meta import sha256_bytes
from provenance.proofcheck import FORMAT, ProofResult, object_id, verify_proof

__all__ = ["ProofError", "ProofResult", "prove", "verify_proof"]


class ProofError(ConfigError):
    """A proof cannot be made as asked (no such file at that commit, no such tag)."""


def prove(
    file: str | Path,
    out: str | Path | None = None,
    *,
    tag: str | None = None,
    commit: str | None = None,
    repo: Repo | None = None,
    remote: Mapping[str, Any] | None = None,
) -> Path:
    """Store the chain blob -> trees -> commit (-> tag) for `file` under `out`; return the folder.

    The commit is the tag's target when a tag is given, else `commit`, else the last commit that
    changed the file. The proof is of the committed bytes; if the work tree's copy differs, that is
    recorded (and `verify-proof --file` will catch it).
    """
    f = Path(file)
    repo = repo or Repo.containing(f if f.exists() else f.parent)
    rel = repo.relpath(f)
    if tag is not None:
        tag_obj = repo.local_tag(tag)
        if tag_obj is None:
            raise ProofError(f"tag {tag!r} not found in {repo.path}")
        if repo.object_type(tag_obj) != "tag":
            raise ProofError(
                f"tag {tag!r} is lightweight; a proof needs an annotated tag (it names the commit and the file hashes)"
            )
        commit = repo.tag_target(tag)
    elif commit is None:
        commit = repo.last_commit_of(rel)
        if commit is None:
            raise ProofError(f"{rel}: never committed in {repo.path}; nothing to prove")
    else:
        commit = repo.resolve(commit)
    try:
        blob = repo.blob_id(commit, rel)
    except Exception:
        raise ProofError(f"{rel}: not in commit {commit[:12]}") from None
    trees = repo.tree_path_ids(commit, rel)
    fmt = repo.object_format()
    objs: dict[str, tuple[str, bytes]] = {blob: repo.object_bytes(blob), commit: repo.object_bytes(commit)}
    for _, tid in trees:
        objs[tid] = repo.object_bytes(tid)
    tag_part = None
    if tag is not None:
        tid = repo.local_tag(tag) or ""
        objs[tid] = repo.object_bytes(tid)
        tag_part = {"name": tag, "id": tid}
    for oid, (kind, content) in objs.items():  # never store a chain git itself would not accept
        if object_id(kind, content, fmt) != oid:
            raise ProofError(f"object {oid} read back from git does not hash to its id; repository corrupt?")
    data = objs[blob][1]
    wt_sha = sha256_bytes(f.read_bytes()) if f.is_file() else None
    folder = Path(out) if out else repo.path / "provenance" / "proofs" / f"{f.stem}-{commit[:12]}"
    if (folder / "proof.json").exists():
        raise ProofError(f"{folder}: already holds a proof; choose another --out")
    (folder / "objects").mkdir(parents=True, exist_ok=True)
    for oid, (_, content) in objs.items():
        (folder / "objects" / oid).write_bytes(content)
    manifest = {
        "format": FORMAT,
        "format_version": 1,
        "object_format": fmt,
        "path": rel,
        "file_sha256": sha256_bytes(data),
        "file_size": len(data),
        "blob": blob,
        "trees": [{"path": p, "id": t} for p, t in trees],
        "commit": commit,
        "tag": tag_part,
        "objects": {oid: kind for oid, (kind, _) in objs.items()},
        "committed_at": repo.commit_time(commit),
        "worktree_sha256_at_proof": wt_sha,
        "remote": dict(remote) if remote else None,
        "made_at": utc_now(),
    }
    (folder / "proof.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    shutil.copyfile(Path(__file__).with_name("proofcheck.py"), folder / "verify_proof.py")
    return folder
