"""What `agentload status` reports about a test, typed: one record per step (registration,
predictions, jobs, runs, verdict, provenance) and the whole.

Why typed: the status travels from review/status.py, where it is gathered from the test directory,
the scheduler and git, to three readers (the text `format_status` prints, the JSON of
`status --json`, the HTML page's summary and sections); a dataclass names each field once, and
`to_json` writes the keys `status --json` has always printed, a key a step leaves unset absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from review.testdir import PRESENT


class JobCategory(StrEnum):
    """What became of a job, for a reader (review/status.py's module docstring says how each is told)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"
    UNKNOWN = "unknown"


CATEGORIES = tuple(c.value for c in JobCategory)


def _some(**kv: Any) -> dict[str, Any]:
    """The keys whose value is not None (a field a step did not reach is not printed)."""
    return {k: v for k, v in kv.items() if v is not None}


@dataclass
class RegistrationStatus:
    """The registration's identity and status (when it could be read) and the test's label."""

    state: str
    note: str
    ref: dict[str, Any] | None
    path: str | None
    name: str | None = None  # the fields below `path` are set when the registration was read
    status: str | None = None
    sha256: str | None = None
    test: str | None = None
    status_reasons: list[str] | None = None
    mismatch: str | None = None
    label: str | None = None
    label_reason: str | None = None
    label_basis: str | None = None
    git: dict[str, Any] | None = None  # the facts `label_now` decided from, before submission

    @property
    def read(self) -> bool:
        return self.name is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "note": self.note, "ref": self.ref, "path": self.path}
        if self.read:
            out.update(
                name=self.name,
                status=self.status,
                sha256=self.sha256,
                test=self.test,
                status_reasons=list(self.status_reasons or []),
            )
        out.update(_some(mismatch=self.mismatch))
        out.update(label=self.label, label_reason=self.label_reason, label_basis=self.label_basis)
        out.update(_some(git=self.git))
        return out


@dataclass
class FreezeLine:
    """A freeze found for the test, with its blindness from the timeline (None when unavailable)."""

    tag: str
    confirmed_at: str | None
    blindness: str | None
    reason: str
    errata: int | None = None  # None: the timeline could not be built

    def to_json(self) -> dict[str, Any]:
        d = {"tag": self.tag, "confirmed_at": self.confirmed_at, "blindness": self.blindness, "reason": self.reason}
        return {**d, **_some(errata=self.errata)}


@dataclass
class ScoreLine:
    """A saved score report: its counts, or why it could not be read (`error`)."""

    path: str | None
    error: str | None = None
    tag: str | None = None
    hits: int = 0
    misses: int = 0
    other: int = 0
    blindness: list[Any] = field(default_factory=list)
    problems: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"path": self.path, "error": self.error}
        return {
            "path": self.path,
            "tag": self.tag,
            "hits": self.hits,
            "misses": self.misses,
            "other": self.other,
            "blindness": self.blindness,
            "problems": self.problems,
        }


@dataclass
class PredictionsStatus:
    frozen: bool
    freezes: list[FreezeLine]
    scored: list[ScoreLine]
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "frozen": self.frozen,
            "freezes": [f.to_json() for f in self.freezes],
            "scored": [s.to_json() for s in self.scored],
            "note": self.note,
        }


@dataclass
class JobLine:
    """One job of the submission manifest (one per task of an array) and its category."""

    job_id: str
    arm: str
    rate: float
    seed: int
    run_dir: str | None
    state: str | None
    run_status: str | None
    category: JobCategory

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "arm": self.arm,
            "rate": self.rate,
            "seed": self.seed,
            "run_dir": self.run_dir,
            "state": None if self.state is None else str(self.state),
            "run_status": None if self.run_status is None else str(self.run_status),
            "category": str(self.category),
        }


@dataclass
class JobsStatus:
    state: str
    note: str
    source: str | None
    counts: dict[JobCategory, int] = field(default_factory=lambda: dict.fromkeys(JobCategory, 0))
    jobs: list[JobLine] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "note": self.note,
            "source": self.source,
            "counts": {str(k): v for k, v in self.counts.items()},
            "jobs": [j.to_json() for j in self.jobs],
        }


@dataclass
class UnboundRun:
    run_dir: str
    reasons: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "reasons": self.reasons}


@dataclass
class RunsStatus:
    """Runs found and by status; with a registration, how many are bound and which are missing."""

    found: int
    by_status: dict[str, int]
    unreadable: list[dict[str, str]]
    bound: int | None = None
    registered: int | None = None
    unbound: list[UnboundRun] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    note: str | None = None  # why binding was not checked
    shared: list[str] = field(default_factory=list)  # runs holding another test's identical simulation

    def to_json(self) -> dict[str, Any]:
        d = {
            "found": self.found,
            "by_status": self.by_status,
            "shared": self.shared,
            "bound": self.bound,
            "registered": self.registered,
            "unbound": [u.to_json() for u in self.unbound],
            "missing": self.missing,
            "unreadable": self.unreadable,
        }
        return {**d, **_some(note=self.note)}


@dataclass
class VerdictStatus:
    """The verdict file's gist when one is present (`state` PRESENT), else why not (`note`)."""

    state: str
    path: str | None
    note: str | None = None
    verdict: str | None = None
    rule: Any = None
    registered: bool = False
    decisive: bool = False
    judged_by: str | None = None
    kill_triggered: list[str] = field(default_factory=list)
    rates: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    runs_judged: int = 0
    others: list[str] = field(default_factory=list)
    stale: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.state != PRESENT:
            return {"state": self.state, "note": self.note, "path": self.path}
        d = {
            "state": self.state,
            "path": self.path,
            "verdict": self.verdict,
            "rule": self.rule,
            "registered": self.registered,
            "decisive": self.decisive,
            "judged_by": self.judged_by,
            "kill_triggered": self.kill_triggered,
            "rates": self.rates,
            "groups": self.groups,
            "runs_judged": self.runs_judged,
            "others": self.others,
        }
        return {**d, **_some(stale=self.stale)}


@dataclass
class ProvenanceStatus:
    """Whole-test verification: the breaks, what was not checked, and for an exploratory test
    (no registration, or an EXPLORATORY one) why it is not registered; that is its state, not a break."""

    state: str
    note: str | None = None
    ok: bool | None = None
    checks: int = 0
    breaks: list[dict[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exploratory: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.state != PRESENT:
            return {"state": self.state, "note": self.note, "ok": None, "breaks": [], "skipped": []}
        d = {
            "state": self.state,
            "ok": self.ok,
            "checks": self.checks,
            "breaks": self.breaks,
            "skipped": self.skipped,
            "notes": self.notes,
        }
        return {**d, **_some(exploratory=self.exploratory)}


@dataclass
class TestStatus:
    """Everything `agentload status` reports about one test directory."""

    __test__ = False  # not a pytest test class

    testdir: str
    test: str | None
    registration: RegistrationStatus
    predictions: PredictionsStatus
    jobs: JobsStatus
    runs: RunsStatus
    verdict: VerdictStatus
    provenance: ProvenanceStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "testdir": self.testdir,
            "test": self.test,
            "registration": self.registration.to_json(),
            "predictions": self.predictions.to_json(),
            "jobs": self.jobs.to_json(),
            "runs": self.runs.to_json(),
            "verdict": self.verdict.to_json(),
            "provenance": self.provenance.to_json(),
        }
