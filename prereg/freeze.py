"""Freezing prediction files: commit, annotated tag listing each file's SHA-256, push, read back.

Why every step: a prediction is blind only if it provably existed, unchanged, before its runs. The
commit fixes the bytes; the annotated tag's message states each frozen file's SHA-256 (so a reader
can check the bytes without trusting this tool); the push puts the commit and the tag where the
team (and later a reviewer) can see them; and reading the remote back, rather than trusting the
push's exit status, gives the time at which the remote was seen to hold both, the moment
blindness is measured from. That time goes into a freeze record (JSON) with everything else.

A freeze refuses a dirty tree (tracked changes other than the files being frozen), refuses a tag
name that already exists locally or on the remote, and never moves a tag. Errata are ordinary later
commits that change a frozen file; the tag keeps pointing at the frozen commit, and `errata()` lists
them with their times so scoring can disclose them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from harness.config.files import safe_load
from harness.errors import ConfigError
from prereg.predictions import FORMAT, PredictionFile, parse_predictions, predictions_from_doc
from provenance.git import GitError, Repo
from provenance.meta import sha256_bytes
from provenance.portable import portable_argv, remote_label
from provenance.proofcheck import tag_message_hashes

# The rule engine's model-value files (analysis/predictions.py: values a rule compares runs with,
# e.g. model F's per-seed CUT slopes) may be frozen beside prediction sets; they are recorded as such.
MODEL_VALUES_FORMAT = "agentload-predictions"
RECORD_FORMAT = "agentload-freeze"
RECORD_DIR = "prereg/freezes"


class FreezeError(ConfigError):
    """A freeze was refused or could not be confirmed (the message says which step and why)."""


def utc_precise() -> str:
    """UTC now with microseconds: confirmation times are compared with run and job times."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def tag_message(tag: str, files: Sequence[tuple[str, str]]) -> str:
    """The tag message: a header and one `sha256 <hex>  <path>` line per frozen file.

    Read back by `provenance.proofcheck.tag_message_hashes`, the one parser of these lines (the
    standalone proof checker must read them with the standard library alone)."""
    lines = [f"agentload freeze {tag}", "", "Frozen files (SHA-256 of the committed bytes):", ""]
    lines += [f"sha256 {sha}  {path}" for path, sha in files]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FreezeRecord:
    """What a freeze did and saw; `confirmed_at` is when the remote was read back holding both."""

    data: dict[str, Any]
    path: Path | None = None

    @property
    def tag(self) -> str:
        return str(self.data["tag"])

    @property
    def commit(self) -> str:
        return str(self.data["commit"])

    @property
    def confirmed_at(self) -> str | None:
        return self.data.get("confirmed_at")

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.data["files"])


def load_record(path: str | Path) -> FreezeRecord:
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise FreezeError(f"{p}: cannot read the freeze record ({exc})") from None
    if data.get("format") != RECORD_FORMAT:
        raise FreezeError(f"{p}: format: got {data.get('format')!r}; expected {RECORD_FORMAT!r}")
    for k in ("tag", "commit", "files"):
        if k not in data:
            raise FreezeError(f"{p}: {k}: missing from the freeze record")
    return FreezeRecord(data, p)


def _prediction_meta(data: bytes, path: str) -> dict[str, Any]:
    """If the file is a prediction file, validate it and return what the record keeps about it."""
    try:
        doc = safe_load(data)
    except yaml.YAMLError:
        return {"kind": "file"}
    if isinstance(doc, dict) and doc.get("format") == MODEL_VALUES_FORMAT:
        return {
            "kind": "model-values",
            "name": doc.get("name"),
            "test": doc.get("test"),
            "n_runs": len(doc.get("runs") or []),
        }
    if not (isinstance(doc, dict) and doc.get("format") == FORMAT):
        return {"kind": "file"}
    pf = parse_predictions(data, path)
    return {
        "kind": "predictions",
        "name": pf.name,
        "test": pf.test,
        "registration_sha256": (pf.registration or {}).get("sha256"),
        "n_predictions": len(pf.predictions),
    }


def _status_path(line: str) -> str:
    """The path of one `git status --porcelain` line ("XY path"), whether or not its leading space
    (an unstaged change: " M path") survived: a re-made prediction file, tracked and modified, is
    the file being frozen, not another change."""
    return line[2:].strip().strip('"')


def freeze(
    files: Sequence[str | Path],
    *,
    tag: str | None = None,
    remote: str | None = None,
    branch: str | None = None,
    record_dirs: Sequence[str | Path] = (),
    message: str | None = None,
) -> FreezeRecord:
    """Commit `files`, tag, push, read the remote back, write the freeze record; return it."""
    if not files:
        raise FreezeError("predict freeze: no files given")
    paths = [Path(f) for f in files]
    for p in paths:
        if not p.is_file():
            raise FreezeError(f"{p}: no such file to freeze")
    repo = Repo.containing(paths[0])
    rels = [repo.relpath(p) for p in paths]
    for p in paths:
        if Repo.containing(p).path.resolve() != repo.path.resolve():
            raise FreezeError(f"{p}: not in the same repository as {paths[0]}")
    metas = {r: _prediction_meta(p.read_bytes(), str(p)) for p, r in zip(paths, rels)}
    dirty = [
        line
        for line in repo.git("status", "--porcelain", "--untracked-files=no").splitlines()
        if line and _status_path(line) not in rels
    ]
    if dirty:
        raise FreezeError(
            f"{repo.path}: the tree has uncommitted changes besides the files to freeze ({'; '.join(dirty)}); "
            "commit or stash them first, so the freeze commit holds only what it freezes"
        )
    d_remote, d_branch = repo.default_remote()
    remote, branch = remote or d_remote, branch or d_branch
    if tag is None:
        name = next((m["name"] for m in metas.values() if m.get("name")), Path(rels[0]).stem)
        tag = f"pred-{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    if not repo.ok("check-ref-format", f"refs/tags/{tag}"):
        raise FreezeError(f"tag {tag!r}: not a valid git tag name")
    if repo.local_tag(tag) is not None:
        raise FreezeError(
            f"tag {tag!r} already exists; a freeze never moves a tag (choose another name; errata are new commits)"
        )
    if repo.remote_tag(tag, remote) is not None:
        raise FreezeError(f"tag {tag!r} already exists on remote {remote!r}; a freeze never moves a tag")

    repo.git("add", "--", *rels)
    staged = not repo.ok("diff", "--cached", "--quiet", "--", *rels)
    if staged:
        msg = message or f"Freeze {', '.join(rels)} under tag {tag}"
        repo.git("commit", "--quiet", "-m", msg, "--", *rels)
    commit = repo.head()
    shas = []
    for p, r in zip(paths, rels):
        blob = repo.blob_at(commit, r)
        if blob != p.read_bytes():
            raise FreezeError(
                f"{p}: the committed bytes differ from the file (a git filter or attribute changes it); not frozen"
            )
        shas.append((r, sha256_bytes(blob)))
    repo.git("tag", "-a", tag, "-m", tag_message(tag, shas), commit)
    tag_obj = repo.local_tag(tag)

    repo.push(remote, f"{commit}:refs/heads/{branch}", f"refs/tags/{tag}")
    chk = repo.remote_contains(commit, remote, branch)
    remote_tag = repo.remote_tag(tag, remote)
    confirmed_at = utc_precise()
    if not chk.contains or remote_tag != tag_obj:
        raise FreezeError(
            f"pushed, but the remote {remote!r} ({chk.url}) does not hold both: branch {branch} contains "
            f"{commit[:12]}: {chk.contains}; tag {tag} there: {remote_tag or 'absent'} (local {tag_obj}). Nothing is "
            "frozen until it does."
        )
    data = {
        "format": RECORD_FORMAT,
        "format_version": 1,
        "tag": tag,
        "tag_object": tag_obj,
        "commit": commit,
        "object_format": repo.object_format(),
        "new_commit": staged,
        "files": [{"path": r, "sha256": s, "blob": repo.blob_id(commit, r), **metas[r]} for r, s in shas],
        "committed_at": repo.commit_time(commit),
        "tagged_at": repo.tag_time(tag),
        "remote": {
            "name": remote,
            "url": remote_label(chk.url),
            "branch": branch,
            "remote_head": chk.remote_head,
            "contains_commit": chk.contains,
            "tag_object_on_remote": remote_tag,
        },
        "confirmed_at": confirmed_at,
        "command": portable_argv(sys.argv, repo.path),
    }
    out_dirs = [Path(d) for d in record_dirs] or [repo.path / RECORD_DIR]
    written = None
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        written = d / f"{tag}.json"
        written.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    return FreezeRecord(data, written)


# ---------------------------------------------------------------------------------------------
# reading a freeze back (from the tag, never from the work tree)
# ---------------------------------------------------------------------------------------------
@dataclass
class FrozenFile:
    path: str
    sha256: str  # as the tag message states it
    data: bytes  # the bytes the tag's commit holds
    worktree_sha256: str | None  # the work tree's copy now (None if absent)
    predictions: PredictionFile | None
    problems: list[str]
    errata: list[dict[str, Any]]
    model_value_runs: list[tuple[str, float, int]] | None = None  # (arm, rate, seed) of a model-values file

    @property
    def edited_since(self) -> bool:
        return self.worktree_sha256 is not None and self.worktree_sha256 != self.sha256


@dataclass
class Frozen:
    tag: str
    commit: str
    record: FreezeRecord | None
    files: list[FrozenFile]
    problems: list[str]

    @property
    def confirmed_at(self) -> str | None:
        return self.record.confirmed_at if self.record else None


def find_record(tag: str, repo: Repo, extra_dirs: Sequence[Path] = ()) -> FreezeRecord | None:
    for d in [*extra_dirs, repo.path / RECORD_DIR]:
        p = Path(d) / f"{tag}.json"
        if p.is_file():
            return load_record(p)
    return None


def read_frozen(ref: str | Path, repo: Repo | None = None, record_dirs: Sequence[Path] = ()) -> Frozen:
    """The frozen files of a tag (or of a freeze record's tag), read from git objects.

    Checks: the tag exists and is annotated; every file the tag message lists is in the tag's commit
    and hashes to the stated SHA-256; the tag still points where the record says (never moved) and
    the remote's tag object is the local one. Also reports each file's work-tree copy when it differs
    (edited after the freeze) and the later commits that changed it (errata, with their times).
    """
    record = None
    if str(ref).endswith(".json") and Path(ref).is_file():
        record = load_record(ref)
        tag = record.tag
        if repo is None:
            try:
                repo = Repo.containing(Path(ref))
            except GitError:  # a record kept beside a test directory outside the repository
                repo = Repo.containing(Path.cwd())
    else:
        tag = str(ref)
        repo = repo or Repo.containing(Path.cwd())
        record = find_record(tag, repo, record_dirs)
    if repo.local_tag(tag) is None:
        raise FreezeError(f"tag {tag!r} is not in {repo.path} (fetch tags from the remote: git fetch --tags)")
    if repo.object_type(repo.local_tag(tag) or "") != "tag":
        raise FreezeError(f"tag {tag!r} is a lightweight tag; a freeze tag is annotated and lists its files' SHA-256")
    commit = repo.tag_target(tag)
    problems: list[str] = []
    if record is not None:
        if record.commit != commit:
            problems.append(
                f"tag {tag} points to {commit[:12]}, but the freeze record says {record.commit[:12]} (the tag was "
                "moved)"
            )
        if record.data.get("tag_object") and record.data["tag_object"] != repo.local_tag(tag):
            problems.append(
                f"tag object {repo.local_tag(tag)} differs from the freeze record's {record.data['tag_object']} (the "
                "tag was re-made)"
            )
    listed = tag_message_hashes(repo.tag_message(tag))
    if not listed:
        problems.append(f"tag {tag}: its message lists no `sha256 <hex>  <path>` lines; not a freeze tag")
    files = []
    for path, sha in listed.items():
        fp: list[str] = []
        try:
            data = repo.blob_at(commit, path)
        except Exception:
            files.append(
                FrozenFile(path, sha, b"", None, None, [f"{path}: listed in tag {tag} but not in its commit"], [])
            )
            continue
        if sha256_bytes(data) != sha:
            fp.append(
                f"{path}: the tagged commit's bytes hash to {sha256_bytes(data)[:12]}, the tag message says {sha[:12]}"
            )
        wt = repo.path / path
        wsha = sha256_bytes(wt.read_bytes()) if wt.is_file() else None
        try:
            doc = safe_load(data)  # once: what kind of file it is, and its predictions or runs
        except yaml.YAMLError:
            doc = None
        pf = _prediction_meta_safe(doc, f"{tag}:{path}", fp)
        errata = [{"commit": c, "committed_at": t} for c, t in repo.commits_touching(path, commit)]
        files.append(FrozenFile(path, sha, data, wsha, pf, fp, errata, _model_value_runs(doc)))
    return Frozen(tag, commit, record, files, problems)


def _model_value_runs(doc: Any) -> list[tuple[str, float, int]] | None:
    if not (isinstance(doc, dict) and doc.get("format") == MODEL_VALUES_FORMAT):
        return None
    out = []
    for e in doc.get("runs") or []:
        try:
            out.append((str(e["arm"]), float(e["rate"]), int(e["seed"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _prediction_meta_safe(doc: Any, where: str, problems: list[str]) -> PredictionFile | None:
    """A frozen file's predictions when its (parsed) document is a prediction file, else None; a
    prediction file that does not validate adds its problem."""
    if not (isinstance(doc, dict) and doc.get("format") == FORMAT):
        return None
    try:
        return predictions_from_doc(doc, where)
    except ConfigError as exc:
        problems.append(str(exc))
        return None
