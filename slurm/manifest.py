"""The submission manifest (`<testdir>/submission.json`) and the label computed from it.

Why a manifest: a registered test's label and its provenance are facts about the submission (which
registration bytes, which commit, whether the remote held it and when that was asked, which jobs in
which order with which arguments and limits) and about the scheduler's record of those jobs
(submit, start and end times). The submission command writes the first kind once, before it knows
the second; `jobs collect` joins them with the accounting export. Nobody edits a manifest: the
label is recomputed from it and the scheduler, never read from it (paper App. E.11-E.13;
rules digest §2, §5.2 and Decision 4).

Layout of a test directory:

    <testdir>/submission.json          this file
    <testdir>/jobs/                    job logs (submitit folders, or local-N.out/.err)
    <testdir>/runs/<arm>-r<rate>-s<seed>/   one run directory per job
    <testdir>/provenance/accounting.json, accounting.csv   the scheduler's record (jobs collect)
    <testdir>/collection.json          what jobs collect found; <testdir>/analysis/ the verdict
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from harness.atomic import write_text_atomic
from harness.errors import RecordError
from harness.recording.schema import RunStatus
from prereg.labels import label_for, to_utc

FORMAT = "agentload-submission"
FORMAT_VERSION = 1
MANIFEST = "submission.json"
RUNS = "runs"
JOBS = "jobs"
PROVENANCE = "provenance"
ACCOUNTING_JSON = "accounting.json"
ACCOUNTING_CSV = "accounting.csv"
COLLECTION = "collection.json"


class ManifestError(RecordError):
    """A manifest is missing or malformed (the message names the file and the field)."""


def write_manifest(doc: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write atomically (a reader never sees half a manifest)."""
    return write_text_atomic(path, json.dumps(doc, indent=2, default=str) + "\n")


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A manifest, from its file or from the test directory that holds it."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{p}: no submission manifest (agentload submit writes <testdir>/{MANIFEST})") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{p}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(
            f"{p}: format: got {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}; expected "
            f"{FORMAT!r}"
        )
    if doc.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{p}: format_version: got {doc.get('format_version')!r}; expected {FORMAT_VERSION}")
    for key in ("registration", "jobs", "executor"):
        if key not in doc:
            raise ManifestError(f"{p}: {key}: missing; expected a submission manifest written by agentload submit")
    doc["_path"] = str(p.resolve())
    return doc


def test_dir(doc: dict[str, Any]) -> Path:
    return Path(doc["_path"]).parent


def job_ids(doc: dict[str, Any]) -> list[str]:
    """Scheduler job ids in submission order (array tasks as ID_TASK)."""
    return [str(j["job_id"]) for j in doc["jobs"] if j.get("job_id") is not None]


def first_submit(times: Iterable[datetime | str | None]) -> str | None:
    """The earliest of the given submit times (ISO 8601 UTC), or None."""
    parsed = [to_utc(t) for t in times if t is not None]
    ts = [t for t in parsed if t is not None]
    return min(ts).isoformat() if ts else None


def label_from_record(
    doc: dict[str, Any], submit_times: Iterable[datetime | str | None], remote_now: dict[str, Any] | None = None
) -> Any:
    """The label of the manifest's runs (prereg.labels.label_for) from the manifest's git facts and
    the given submit times of its jobs (the scheduler's, or the local clock's without one).

    Every job of a manifest counts (a submission holds no smoke jobs). The remote confirmation is
    the one the submission asked before submitting; when that said "not contained", a later
    confirmation (`remote_now`, asked at collection) is passed too, so the reason says when the
    commit reached the remote, which never makes the label pre-registered."""
    reg = doc["registration"]
    remote = doc.get("remote") or {}
    confirmed = remote.get("checked_at") if remote.get("contains") else None
    if confirmed is None and remote_now and remote_now.get("contains"):
        confirmed = remote_now.get("checked_at")
    return label_for(
        status=reg.get("status"),
        committed=bool(reg.get("committed")),
        clean=bool(reg.get("clean")),
        commit_time=reg.get("commit_time"),
        remote_confirmed_at=confirmed,
        first_submit=first_submit(submit_times),
    )


def run_meta(path: Path) -> dict[str, Any] | None:
    """The run's meta.json, or None where it is missing, unreadable or not a JSON object (collect,
    resubmit and verify read a job's run with it)."""
    try:
        meta = orjson.loads((path / "meta.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def never_started(meta: dict[str, Any] | None) -> tuple[bool, str]:
    """Did this run end before sending anything of its plan? (status REFUSED or FAILED, no turn sent,
    every record table empty); with the reason either way. Only such a job may be submitted again
    (slurm/resubmit.py), and `provenance verify` checks it of every job that was."""
    if meta is None:
        return False, "no readable meta.json: what the job did is not on record"
    status = meta.get("status")
    if status not in (RunStatus.REFUSED, RunStatus.FAILED):
        return False, f"its run is {status}: only a run that never started may be submitted again"
    sent = (meta.get("drive") or {}).get("sent")
    tables = meta.get("tables")
    if not isinstance(tables, dict) or not tables:
        return False, "its meta.json lists no record tables, so it cannot show that nothing was sent"
    rows = {k: (t or {}).get("rows") for k, t in tables.items()}
    if sent not in (0, None) or any(r != 0 for r in rows.values()):
        return False, f"its run had started (turns sent {sent}, table rows {rows}): it is judged as it ended"
    return True, f"{status} before its run: {meta.get('status_reason') or 'no reason recorded'}"
