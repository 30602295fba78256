"""Readers for the records a test directory holds: the submission manifest, the scheduler's
accounting export, each run's meta.json, and the registration a test is bound to.

Why typed readers: the timeline and the verifier compare times and hashes from files written by
other steps (the submit command, the accounting export, the job script, the registration fill).
Each reader states exactly which fields it relies on, converts every time to an aware UTC
datetime, and fails with the file and field when one is missing or malformed, so a change in a
writer shows up here as a clear error, not as a silently wrong label.

Fields read (a writer may add others):

`<testdir>/submission.json` (written by the submit command)
    test                     test name
    registration             {name, path (repo-relative), sha256, commit}
    remote_check             {remote, branch, url, remote_head, contains, checked_at (UTC)}: the
                             remote asked, at submission, whether its branch held the commit
    label                    optional: the label claimed for the test at submission
    jobs[]                   {job_id, arm, rate, seed, plan_sha256, run_dir (relative to testdir)}

`<testdir>/provenance/accounting.json` (the scheduler's accounting export, UTC)
    a list of rows, or {"rows": [...]}; each row either in sacct's own names (JobID, JobName,
    Submit, Start, End, State, ExitCode, NodeList, Timelimit, Elapsed, Comment) or in the export's
    (job_id, job_name, submit_utc, start_utc, end_utc, state, exit_code, node_list, comment).
    Times are ISO-8601; a time without a zone is UTC; "Unknown", "None" and "" mean not known.

`<run>/meta.json` (docs/run-format.md): registration {name, path, sha256, commit}, plan {sha256,
    file}, cell, arm, rate, seed, status, created_at, finished_at, provenance {git {commit, dirty},
    slurm {slurm_job_id, slurm_array_job_id, slurm_array_task_id}}.

Registration (prereg/registrations/<name>.yaml), read through prereg.registration: name, status,
    test, cell, arms, rates, seeds, plans [{arm, rate, seed, sha256}].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from harness.errors import RecordError
from prereg.registration import RegistrationError, registration_document, registration_from_data

MANIFEST = "submission.json"
ACCOUNTING = "provenance/accounting.json"


def parse_utc(value: Any, where: str = "time") -> datetime | None:
    """An aware UTC datetime from an ISO-8601 string (naive = UTC); None for unknown times."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    s = str(value).strip()
    if s in ("", "Unknown", "None", "N/A", "null"):
        return None
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        raise RecordError(f"{where}: got {value!r}; expected an ISO-8601 time (UTC)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat(timespec="microseconds" if t.microsecond else "seconds")


def _load_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from None


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(d, Mapping) or d.get(key) is None:
        raise RecordError(f"{where}.{key}: missing")
    return d[key]


# ---------------------------------------------------------------------------------------------
# submission manifest
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteConfirmation:
    remote: str | None
    branch: str | None
    url: str | None
    remote_head: str | None
    contains: bool
    checked_at: datetime | None


@dataclass(frozen=True)
class RegistrationRef:
    name: str | None
    path: str
    sha256: str
    commit: str | None


@dataclass(frozen=True)
class ManifestJob:
    job_id: str
    arm: str | None
    rate: float | None
    seed: int | None
    plan_sha256: str | None
    run_dir: str | None


@dataclass(frozen=True)
class Manifest:
    path: Path
    test: str | None
    registration: RegistrationRef
    remote_check: RemoteConfirmation | None
    label: str | None
    jobs: list[ManifestJob]
    raw: dict[str, Any]


def registration_ref(d: Any, where: str) -> RegistrationRef:
    return RegistrationRef(d.get("name"), str(_need(d, "path", where)), str(_need(d, "sha256", where)), d.get("commit"))


def read_manifest(testdir: str | Path) -> Manifest | None:
    p = Path(testdir) / MANIFEST
    if not p.is_file():
        return None
    doc = _load_json(p)
    w = str(p)
    reg = registration_ref(_need(doc, "registration", w), f"{w}: registration")
    rc = doc.get("remote_check") or doc.get("remote")
    remote = None
    if rc is not None:
        remote = RemoteConfirmation(
            rc.get("remote"),
            rc.get("branch"),
            rc.get("url"),
            rc.get("remote_head"),
            bool(rc.get("contains")),
            parse_utc(rc.get("checked_at"), f"{w}: remote_check.checked_at"),
        )
    jobs = []
    for i, j in enumerate(doc.get("jobs") or []):
        jid = _need(j, "job_id", f"{w}: jobs[{i}]")
        jobs.append(
            ManifestJob(
                str(jid),
                j.get("arm"),
                None if j.get("rate") is None else float(j["rate"]),
                None if j.get("seed") is None else int(j["seed"]),
                j.get("plan_sha256"),
                j.get("run_dir"),
            )
        )
    return Manifest(p, doc.get("test"), reg, remote, doc.get("label"), jobs, doc)


# ---------------------------------------------------------------------------------------------
# accounting export
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    job_id: str
    name: str | None
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    state: str | None
    exit_code: str | None
    node_list: str | None
    comment: str | None


_SACCT = {
    "id": "JobID",
    "name": "JobName",
    "submit": "Submit",
    "start": "Start",
    "end": "End",
    "state": "State",
    "exit": "ExitCode",
    "nodes": "NodeList",
    "comment": "Comment",
}
_SNAKE = {
    "id": "job_id",
    "name": "job_name",
    "submit": "submit_utc",
    "start": "start_utc",
    "end": "end_utc",
    "state": "state",
    "exit": "exit_code",
    "nodes": "node_list",
    "comment": "comment",
}


def read_accounting(testdir: str | Path) -> dict[str, Job] | None:
    p = Path(testdir) / ACCOUNTING
    if not p.is_file():
        return None
    doc = _load_json(p)
    rows = doc.get("rows") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        raise RecordError(f"{p}: expected a list of accounting rows (or {{rows: [...]}})")
    out: dict[str, Job] = {}
    for i, r in enumerate(rows):
        w = f"{p}: rows[{i}]"
        if not isinstance(r, dict):
            raise RecordError(f"{w}: got {r!r}; expected a mapping")
        names = _SNAKE if "job_id" in r else _SACCT
        jid = str(_need(r, names["id"], w))
        if "." in jid:  # job steps (123.batch, 123.0) belong to their job
            continue
        t = {n: parse_utc(r.get(names[n]), f"{w}.{names[n]}") for n in ("submit", "start", "end")}
        code = r.get(names["exit"])
        out[jid] = Job(
            jid,
            r.get(names["name"]),
            t["submit"],
            t["start"],
            t["end"],
            r.get(names["state"]),
            None if code is None else str(code),
            r.get(names["nodes"]),
            r.get(names["comment"]),
        )
    return out


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    path: Path
    meta: dict[str, Any]
    arm: str
    rate: float
    seed: int
    status: str
    created_at: datetime | None
    finished_at: datetime | None
    registration: dict[str, Any] | None
    plan_sha256: str | None
    job_id: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.arm.upper(), round(self.rate, 6), self.seed)


def job_id_of(meta: Mapping[str, Any]) -> str | None:
    """The scheduler job id of a run from its meta.json (array jobs as <array job>_<task>)."""
    slurm = ((meta.get("provenance") or {}).get("slurm") or {}) if isinstance(meta.get("provenance"), dict) else {}
    top_slurm = meta.get("slurm")
    top = top_slurm if isinstance(top_slurm, dict) else {}
    arr, task = (
        slurm.get("slurm_array_job_id") or top.get("array_job_id"),
        slurm.get("slurm_array_task_id") or top.get("array_task_id"),
    )
    if arr and task is not None:
        return f"{arr}_{task}"
    jid = slurm.get("slurm_job_id") or top.get("job_id")
    return None if jid is None else str(jid)


def read_run(d: str | Path) -> RunRecord:
    p = Path(d)
    meta = _load_json(p / "meta.json")
    w = f"{p}/meta.json"
    reg = meta.get("registration")
    return RunRecord(
        path=p,
        meta=meta,
        arm=str(_need(meta, "arm", w)),
        rate=float(_need(meta, "rate", w)),
        seed=int(_need(meta, "seed", w)),
        status=str(meta.get("status") or "UNKNOWN"),
        created_at=parse_utc(meta.get("created_at"), f"{w}: created_at"),
        finished_at=parse_utc(meta.get("finished_at"), f"{w}: finished_at"),
        registration=reg if isinstance(reg, dict) else None,
        plan_sha256=(meta.get("plan") or {}).get("sha256"),
        job_id=job_id_of(meta),
    )


def find_runs(testdir: str | Path) -> list[RunRecord]:
    """Every run under `<testdir>/runs/` (or under testdir itself when it has no runs/ folder)."""
    base = Path(testdir) / "runs"
    base = base if base.is_dir() else Path(testdir)
    dirs = sorted({m.parent for m in base.rglob("meta.json") if "analysis" not in m.parts and "proofs" not in m.parts})
    return [read_run(d) for d in dirs]


# ---------------------------------------------------------------------------------------------
# the registration, by its documented keys
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegistrationView:
    """What the timeline and the verifier need from a registration file's bytes."""

    name: str | None
    status: str | None
    test: str | None
    cell: dict[str, Any]
    arms: list[str]
    rates: list[float]
    seeds: list[int]
    plans: dict[tuple[str, float, int], str]
    raw: dict[str, Any]

    def registered_runs(self) -> list[tuple[str, float, int]]:
        return [(a.upper(), round(r, 6), s) for a in self.arms for r in self.rates for s in self.seeds]


def registration_view(data: bytes, where: str) -> RegistrationView:
    """The registration's bytes through the project's one loader (prereg.registration), reduced
    to what the timeline and the verifier read. A file that loader refuses is a RecordError."""
    try:
        doc = registration_document(data)
    except yaml.YAMLError as exc:
        raise RecordError(f"{where}: not valid YAML ({exc})") from None
    try:
        reg = registration_from_data(doc, where, raw=data)
    except RegistrationError as exc:
        raise RecordError(str(exc)) from None
    plans = {(p.arm.upper(), round(p.rate, 6), p.seed): p.sha256 for p in reg.plans}
    return RegistrationView(
        reg.name,
        reg.status,
        reg.test,
        reg.cell.model_dump(mode="json"),
        list(reg.arms),
        reg.multiples(),
        list(reg.seeds),
        plans,
        doc,
    )
