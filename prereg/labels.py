"""The label a registered test's runs carry, computed from recorded facts, never asserted.

Definitions (paper Table 1, §2, App. E.5; rules digest §2 and Decision 4):

* pre-registered: a FILLED registration whose commit was confirmed on the remote branch before the
  scheduler's submit time of the first counted job;
* registered: a FILLED registration committed, in a clean tree, before that submit time, but not
  confirmed on the remote by then;
* exploratory: anything else (an EXPLORATORY or INCOMPLETE status, an uncommitted or dirty file,
  a commit made after the first submission, no registration at all).

"Before" is at-or-before at the clocks' one-second resolution: a submission command confirms the
remote and then submits, and both can fall in the same second of the scheduler's record.

`label_for` is the pure rule over facts (the submission manifest and the scheduler's accounting
supply them after the fact); `label_now` asks git for the facts of a registration file in its
working tree and answers "what would jobs submitted now get", which is what `prereg check` prints.
Commit time is the committer's own clock (weak evidence, and the paper's only evidence for
"registered"); remote confirmation is an answer from the remote itself (provenance.git).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provenance.git import GitError, Repo, utc_now

PRE_REGISTERED = "pre-registered"
REGISTERED = "registered"
EXPLORATORY = "exploratory"
LABELS = (PRE_REGISTERED, REGISTERED, EXPLORATORY)

Time = str | datetime | None


def to_utc(t: Time) -> datetime | None:
    """An ISO-8601 string or a datetime as an aware UTC datetime (naive values are refused: a wall
    clock without its zone cannot be ordered against the scheduler's record)."""
    if t is None:
        return None
    if isinstance(t, str):
        s = t.strip()
        if s.endswith("Z"):
            s = s[:-1] + "+00:00"
        try:
            t = datetime.fromisoformat(s)
        except ValueError:
            raise ValueError(
                f"time {t!r}: expected ISO-8601 with a UTC offset, e.g. 2026-10-24T20:09:54+00:00"
            ) from None
    if t.tzinfo is None:
        raise ValueError(f"time {t.isoformat()}: expected a time zone (UTC offset); naive times cannot be ordered")
    return t.astimezone(UTC)


@dataclass(frozen=True)
class Label:
    """A label with the facts it was computed from and the reason in words."""

    label: str  # pre-registered | registered | exploratory
    reason: str
    decisive: bool  # a FILLED registration bound the runs (the verdict may be called decisive)
    facts: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def label_for(
    *,
    status: str | None,
    committed: bool,
    clean: bool,
    commit_time: Time,
    remote_confirmed_at: Time,
    first_submit: Time,
) -> Label:
    """The label from facts.

    status: the registration's status (None: no registration).
    committed / clean: the registration file was committed, and the tree it was submitted from had
      no uncommitted change to tracked files.
    commit_time: committer time of the registration's commit.
    remote_confirmed_at: when the remote branch was confirmed (asked) to contain that commit; None if
      never confirmed.
    first_submit: the scheduler's submit time of the first counted job (smoke jobs never count).
    """
    ct, rc, fs = to_utc(commit_time), to_utc(remote_confirmed_at), to_utc(first_submit)
    facts = {
        "status": status,
        "committed": committed,
        "clean": clean,
        "commit_time": ct.isoformat() if ct else None,
        "remote_confirmed_at": rc.isoformat() if rc else None,
        "first_submit": fs.isoformat() if fs else None,
    }

    def out(label: str, reason: str) -> Label:
        return Label(label, reason, label != EXPLORATORY, facts)

    if status is None:
        return out(EXPLORATORY, "no registration binds the runs")
    if status != "FILLED":
        return out(EXPLORATORY, f"the registration's status is {status}; only a FILLED registration registers a test")
    if not committed:
        return out(EXPLORATORY, "the registration file is not committed")
    if not clean:
        return out(EXPLORATORY, "the tree had uncommitted changes to tracked files")
    if ct is None or fs is None:
        return out(EXPLORATORY, "commit time or first submit time unknown")
    if ct > fs:
        return out(EXPLORATORY, f"committed at {ct.isoformat()}, after the first submission at {fs.isoformat()}")
    if rc is not None and rc <= fs:
        return out(
            PRE_REGISTERED, f"on the remote by {rc.isoformat()}, at or before the first submission at {fs.isoformat()}"
        )
    if rc is None:
        return out(
            REGISTERED,
            f"committed at {ct.isoformat()}, before the first submission at {fs.isoformat()}, but not confirmed on the "
            "remote",
        )
    return out(
        REGISTERED,
        f"committed before the first submission ({fs.isoformat()}) but confirmed on the remote only at "
        f"{rc.isoformat()}",
    )


@dataclass(frozen=True)
class GitFacts:
    """What git says about a registration file now (the inputs of the check-time label)."""

    path: str  # repository-relative
    state: str  # untracked | modified | committed
    clean: bool  # no uncommitted change to any tracked file
    commit: str | None  # newest commit that changed the file
    commit_time: str | None
    head: str | None
    remote: str | None
    branch: str | None
    remote_url: str | None
    remote_head: str | None
    on_remote: bool
    checked_at: str | None
    remote_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def git_facts(path: str | Path, remote: str | None = None, branch: str | None = None) -> GitFacts:
    """Ask git about `path`: committed? in which commit? clean tree? does the remote branch hold it?"""
    repo = Repo.containing(path)
    rel = repo.relpath(path)
    state = repo.file_state(rel)
    clean = repo.is_clean()
    commit = repo.last_commit_of(rel) if state != "untracked" else None
    ctime = repo.commit_time(commit) if commit else None
    head = repo.git("rev-parse", "HEAD", check=False) or None
    on_remote, r_head, r_name, r_branch, url, checked, err = False, None, remote, branch, None, None, None
    if commit is not None:
        try:
            rc = repo.remote_contains(commit, remote, branch)
            on_remote, r_head, r_name, r_branch, url, checked = (
                rc.contains,
                rc.remote_head,
                rc.remote,
                rc.branch,
                rc.url,
                rc.checked_at,
            )
        except GitError as exc:
            err = str(exc)
    return GitFacts(rel, state, clean, commit, ctime, head, r_name, r_branch, url, r_head, on_remote, checked, err)


def label_now(
    path: str | Path,
    status: str | None,
    remote: str | None = None,
    branch: str | None = None,
    facts: GitFacts | None = None,
) -> tuple[Label, GitFacts]:
    """The label jobs submitted now would get: the submission is 'now', after the check."""
    f = facts or git_facts(path, remote, branch)
    now = utc_now()
    lab = label_for(
        status=status,
        committed=f.state == "committed",
        clean=f.clean,
        commit_time=f.commit_time,
        remote_confirmed_at=f.checked_at if f.on_remote else None,
        first_submit=now,
    )
    return lab, f
