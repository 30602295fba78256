"""The order of events of a test, from the record, and the labels that order decides.

Why computed: "pre-registered" and "blind in time" are claims about order (the registration on the
remote before the first job was submitted; the prediction on the remote before its runs were
submitted or started). The paper assembled that order by hand from a push log and scheduler
exports; here it is read from git (commit times; the freeze and submission records of when the
remote was seen to hold a commit), the scheduler's accounting export (submit, start, end) and
each run's meta.json (run start and end), all in UTC, and the labels follow by rule:

Registration label (rules-digest Decisions, AMB-4): prereg.labels.label_for decides it from the
facts gathered here (status, commit time, clean tree, the remote confirmation the submission
manifest recorded, the first counted job's submit time):
  pre-registered  the registration's commit was confirmed on the remote at or before the
                  scheduler's submit time of the first counted job
  registered      committed before that submit time, but not confirmed on the remote by then
  exploratory     otherwise, or the registration is not FILLED

Prediction blindness (per prediction, over the runs it is about):
  blind in time                    the freeze was confirmed on the remote before the earliest
                                   submit of those runs
  blind in time (start criterion)  before the earliest start, not before the earliest submit
  not blind                        otherwise, or no record shows the freeze reached the remote
  blind by access only             never computed: shown only where the prediction file declares
                                   it, marked "declared, not verified"

Without a scheduler export (runs driven locally), a run's meta.json `created_at` stands for both
its submit and its start, and the timeline says so. Blindness comparisons are strict (a run time
recorded to the second that equals the freeze's microsecond confirmation time counts as not after
it), the conservative reading for the stronger claim; the label follows prereg.labels (at or before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.errors import RecordError
from prereg.freeze import FreezeError, FreezeRecord, Frozen, load_record, read_frozen
from prereg.labels import label_for
from prereg.predictions import About, Prediction
from provenance.git import GitError, Repo
from provenance.meta import sha256_bytes
from review.records import (
    Job,
    Manifest,
    RegistrationRef,
    RegistrationView,
    RemoteConfirmation,
    RunRecord,
    find_runs,
    iso,
    parse_utc,
    read_accounting,
    read_manifest,
    registration_ref,
    registration_view,
)

BLIND = "blind in time"
BLIND_START = "blind in time (start criterion)"
NOT_BLIND = "not blind"
PRE, REG, EXPL = "pre-registered", "registered", "exploratory"


@dataclass(frozen=True)
class Event:
    at: datetime | None
    kind: str
    subject: str
    source: str


@dataclass
class RunTimes:
    run: RunRecord
    job: Job | None
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    times_from: str  # "scheduler" | "meta.json"


@dataclass
class RegistrationFacts:
    ref: RegistrationRef | None
    committed_at: datetime | None
    remote: RemoteConfirmation | None
    view: RegistrationView | None
    committed_sha256: str | None  # SHA-256 of the bytes at the registration's commit
    worktree_sha256: str | None
    later_commits: list[tuple[str, str]]
    source: str
    problems: list[str] = field(default_factory=list)
    manifest_dirty: bool | None = None  # the submitting tree's dirty flag, where the manifest records it


@dataclass
class Blindness:
    label: str
    reason: str
    declared: str | None = None
    earliest_submit: datetime | None = None
    earliest_start: datetime | None = None

    def text(self) -> str:
        return self.label + (f"; declared {self.declared} (not verified)" if self.declared else "")


@dataclass
class FreezeFacts:
    tag: str
    frozen: Frozen
    confirmed_at: datetime | None
    by_prediction: dict[str, Blindness]
    overall: Blindness
    errata: list[dict[str, Any]]


@dataclass
class Timeline:
    testdir: Path
    events: list[Event]
    registration: RegistrationFacts
    label: str
    label_reason: str
    runs: list[RunTimes]
    counted: list[RunTimes]
    freezes: list[FreezeFacts]
    manifest: Manifest | None
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        r = self.registration
        return {
            "testdir": str(self.testdir),
            "label": self.label,
            "label_reason": self.label_reason,
            "registration": None
            if r.ref is None
            else {
                "path": r.ref.path,
                "sha256": r.ref.sha256,
                "commit": r.ref.commit,
                "committed_at": iso(r.committed_at),
                "remote_confirmed_at": iso(r.remote.checked_at) if r.remote and r.remote.contains else None,
                "source": r.source,
                "status": r.view.status if r.view else None,
                "problems": r.problems,
            },
            "events": [
                {"at": iso(e.at), "kind": e.kind, "subject": e.subject, "source": e.source} for e in self.events
            ],
            "predictions": [
                {
                    "tag": f.tag,
                    "confirmed_at": iso(f.confirmed_at),
                    "blindness": f.overall.text(),
                    "reason": f.overall.reason,
                    "by_prediction": {k: b.text() for k, b in f.by_prediction.items()},
                    "errata": f.errata,
                }
                for f in self.freezes
            ],
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------------
# pieces
# ---------------------------------------------------------------------------------------------
def run_times(
    runs: Sequence[RunRecord], manifest: Manifest | None, accounting: dict[str, Job] | None
) -> list[RunTimes]:
    """Each run with its job's submit / start / end (scheduler), or its own meta.json times."""
    by_dir: dict[str, str] = {}
    if manifest is not None:
        for j in manifest.jobs:
            if j.run_dir:
                by_dir[Path(j.run_dir).name] = j.job_id
    out = []
    for r in runs:
        jid = r.job_id or by_dir.get(r.path.name)
        job = accounting.get(jid) if (accounting is not None and jid is not None) else None
        if job is not None:
            out.append(RunTimes(r, job, job.submit, job.start, job.end, "scheduler"))
        else:
            out.append(RunTimes(r, None, r.created_at, r.created_at, r.finished_at, "meta.json"))
    return out


def repo_for(testdir: Path, repo: Repo | None = None) -> Repo | None:
    """The repository a test is judged against: the one given, else the one holding the test
    directory, else the current directory's; None outside any repository."""
    if repo is not None:
        return repo
    for start in (testdir, Path.cwd()):
        try:
            return Repo.containing(start)
        except GitError:
            continue
    return None


def registration_facts(manifest: Manifest | None, runs: Sequence[RunRecord], repo: Repo | None) -> RegistrationFacts:
    """The registration a test is bound to, its commit time, bytes and remote confirmation."""
    ref, source, remote = None, "none", None
    if manifest is not None:
        ref, source, remote = manifest.registration, "submission manifest", manifest.remote_check
    else:
        bound = [r.registration for r in runs if r.registration and r.registration.get("sha256")]
        if bound:
            ref, source = registration_ref(bound[0], f"{runs[0].path}/meta.json: registration"), "runs' meta.json"
    facts = RegistrationFacts(ref, None, remote, None, None, None, [], source)
    if manifest is not None and ("dirty" in manifest.raw or "clean" in manifest.raw):
        facts.manifest_dirty = (
            bool(manifest.raw["dirty"]) if "dirty" in manifest.raw else not bool(manifest.raw["clean"])
        )
    if ref is None:
        facts.problems.append("no registration: neither a submission manifest nor any run's meta.json names one")
        return facts
    if repo is None:
        facts.problems.append("not inside a git repository: the registration's commit cannot be read")
        return facts
    commit = ref.commit or repo.last_commit_of(ref.path)
    if commit is None:
        facts.problems.append(f"{ref.path}: never committed")
        return facts
    if ref.commit is None:
        facts.ref = RegistrationRef(ref.name, ref.path, ref.sha256, commit)
        facts.problems.append(f"the record names no commit for {ref.path}; using its last commit {commit[:12]}")
    try:
        data = repo.blob_at(commit, ref.path)
    except GitError:
        facts.problems.append(f"{ref.path} is not in commit {commit[:12]}")
        return facts
    facts.committed_at = parse_utc(repo.commit_time(commit))
    facts.committed_sha256 = sha256_bytes(data)
    try:
        facts.view = registration_view(data, f"{commit[:12]}:{ref.path}")
    except RecordError as exc:
        facts.problems.append(str(exc))
    wt = repo.path / ref.path
    facts.worktree_sha256 = sha256_bytes(wt.read_bytes()) if wt.is_file() else None
    facts.later_commits = repo.commits_touching(ref.path, commit)
    return facts


def counted_runs(times: Sequence[RunTimes], facts: RegistrationFacts) -> list[RunTimes]:
    """Runs bound to the registration (its SHA-256) and among its registered arm x rate x seed."""
    if facts.ref is None:
        return list(times)
    reg = set(facts.view.registered_runs()) if facts.view and facts.view.arms else None
    return [
        t
        for t in times
        if (t.run.registration or {}).get("sha256") == facts.ref.sha256 and (reg is None or t.run.key in reg)
    ]


def registration_label(facts: RegistrationFacts, counted: Sequence[RunTimes]) -> tuple[str, str]:
    """(label, why): the facts of the record handed to prereg.labels.label_for, the project's one rule."""
    if facts.ref is not None and facts.committed_sha256 is not None and facts.committed_sha256 != facts.ref.sha256:
        return (
            EXPL,
            f"the bytes at commit {str(facts.ref.commit)[:12]} hash to {facts.committed_sha256[:12]}, not the bound "
            f"{facts.ref.sha256[:12]}",
        )
    submits = [t.submit for t in counted if t.submit is not None]
    first = min(submits) if submits else None
    src = (
        "scheduler submit"
        if any(t.times_from == "scheduler" for t in counted)
        else "run start in meta.json (no scheduler record)"
    )
    rc = facts.remote
    lab = label_for(
        status=(facts.view.status if facts.view else None) if facts.ref is not None else None,
        committed=facts.committed_at is not None,
        clean=not (facts.manifest_dirty or False),
        commit_time=facts.committed_at,
        remote_confirmed_at=rc.checked_at if rc is not None and rc.contains else None,
        first_submit=first,
    )
    why = lab.reason + (f" (first counted time: {src})" if first else "")
    if rc is None and facts.ref is not None:
        why += "; no submission manifest records the remote holding it"
    elif rc is not None and not rc.contains:
        why += f"; the remote did not contain it when asked at {iso(rc.checked_at)}"
    return lab.label, why


def runs_about(p: Prediction, times: Sequence[RunTimes]) -> list[RunTimes]:
    a = p.about
    if a.scope == "measurement":
        return []
    out = []
    for t in times:
        r = t.run
        if a.rate is not None and round(r.rate, 6) != round(a.rate, 6):
            continue
        if a.scope == "run" and (r.arm.upper() != (a.arm or "").upper() or r.seed != a.seed):
            continue
        if a.scope == "seed" and r.seed != a.seed:
            continue
        out.append(t)
    return out


def blindness(confirmed_at: datetime | None, runs: Sequence[RunTimes], declared: str | None = None) -> Blindness:
    """The blindness label of a freeze for the runs it predicts (see the module doc)."""
    subs = [t.submit for t in runs if t.submit is not None]
    starts = [t.start for t in runs if t.start is not None]
    s, st = (min(subs) if subs else None), (min(starts) if starts else None)
    if not runs:
        return Blindness(
            NOT_BLIND if confirmed_at is None else "no runs to compare",
            "no run of the test is among those predicted",
            declared,
        )
    if confirmed_at is None:
        return Blindness(NOT_BLIND, "no record that the freeze reached the remote", declared, s, st)
    if s is not None and confirmed_at < s:
        return Blindness(BLIND, f"on the remote {iso(confirmed_at)}, before the earliest submit {iso(s)}", None, s, st)
    if st is not None and confirmed_at < st:
        return Blindness(
            BLIND_START,
            f"on the remote {iso(confirmed_at)}, after the earliest submit {iso(s)} but before the earliest start "
            f"{iso(st)}",
            None,
            s,
            st,
        )
    return Blindness(
        NOT_BLIND, f"on the remote {iso(confirmed_at)}, not before the earliest start {iso(st)}", declared, s, st
    )


_ORDER = {BLIND: 0, BLIND_START: 1, "no runs to compare": 0, NOT_BLIND: 2}


def freeze_facts(fz: Frozen, times: Sequence[RunTimes]) -> FreezeFacts:
    conf = parse_utc(fz.confirmed_at)
    by: dict[str, Blindness] = {}
    all_runs: dict[Path, RunTimes] = {}
    declared = None
    for f in fz.files:
        pf = f.predictions
        if f.model_value_runs is not None:  # a rule's model-value file: blind for the runs it lists
            for arm, rate, seed in f.model_value_runs:
                p = Prediction(
                    f"{f.path}:{arm}-r{rate:g}-s{seed}",
                    "model values",
                    About("run", None if arm == "*" else arm, rate, seed),
                    "value",
                    {"kind": "model_f"},
                    {},
                )
                rs = (
                    runs_about(p, times)
                    if arm != "*"
                    else [t for t in times if round(t.run.rate, 6) == round(rate, 6) and t.run.seed == seed]
                )
                by[p.id] = blindness(conf, rs, None)
                for t in rs:
                    all_runs[t.run.path] = t
        if pf is None:
            continue
        if pf.declared_blindness:
            declared = pf.declared_blindness["label"]
        for p in pf.predictions:
            rs = runs_about(p, times)
            by[p.id] = blindness(conf, rs, declared)
            for t in rs:
                all_runs[t.run.path] = t
    overall = blindness(conf, list(all_runs.values()), declared)
    errata = []
    for f in fz.files:
        for e in f.errata:
            errata.append({"path": f.path, **e})
    return FreezeFacts(fz.tag, fz, conf, by, overall, errata)


def discover_freezes(testdir: Path, repo: Repo | None, test: str | None) -> list[FreezeRecord]:
    """Freeze records in <testdir>/provenance/freezes/ and the repository's prereg/freezes/ for this test."""
    dirs = [testdir / "provenance" / "freezes"]
    if repo is not None:
        dirs.append(repo.path / "prereg" / "freezes")
    seen: dict[str, FreezeRecord] = {}
    for d in dirs:
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            rec = load_record(p)
            if rec.tag in seen:
                continue
            tests = {f.get("test") for f in rec.files if f.get("kind") == "predictions"}
            if test is None or test in tests or d == dirs[0]:
                seen[rec.tag] = rec
    return list(seen.values())


def build_timeline(
    testdir: str | Path, *, repo: Repo | None = None, freezes: Sequence[str | Path] | None = None
) -> Timeline:
    """Everything the labels rest on, for one test directory."""
    td = Path(testdir)
    repo = repo_for(td, repo)
    manifest = read_manifest(td)
    accounting = read_accounting(td)
    runs = find_runs(td)
    times = run_times(runs, manifest, accounting)
    facts = registration_facts(manifest, runs, repo)
    counted = counted_runs(times, facts)
    label, why = registration_label(facts, counted)
    notes: list[str] = list(facts.problems)
    if accounting is None:
        notes.append("no scheduler accounting export: each run's meta.json created_at stands for its submit and start")
    test = (
        manifest.test
        if manifest
        else (facts.view.test if facts.view else next((r.meta.get("test") for r in runs), None))
    )
    recs: list[Any] = list(freezes) if freezes is not None else discover_freezes(td, repo, test)
    ffs = []
    for rec in recs:
        try:
            fz = read_frozen(rec.path if isinstance(rec, FreezeRecord) and rec.path else rec, repo)
        except FreezeError as exc:
            notes.append(str(exc))
            continue
        ffs.append(freeze_facts(fz, counted or times))
    events = _events(facts, times, ffs)
    return Timeline(td, events, facts, label, why, times, counted, ffs, manifest, notes)


def _events(facts: RegistrationFacts, times: Sequence[RunTimes], ffs: Sequence[FreezeFacts]) -> list[Event]:
    ev: list[Event] = []
    if facts.ref is not None:
        c = str(facts.ref.commit)[:12]
        ev.append(
            Event(facts.committed_at, "registration committed", f"{facts.ref.path} @ {c}", "git (committer clock)")
        )
        rc = facts.remote
        if rc is not None:
            ev.append(
                Event(
                    rc.checked_at,
                    "registration on remote" if rc.contains else "registration NOT on remote",
                    f"{rc.remote}/{rc.branch} head {str(rc.remote_head)[:12]}",
                    "submission manifest",
                )
            )
        for oid, committed in facts.later_commits:
            ev.append(Event(parse_utc(committed), "registration changed", f"{facts.ref.path} @ {oid[:12]}", "git"))
    for f in ffs:
        rec = f.frozen.record
        if rec is not None:
            ev.append(
                Event(
                    parse_utc(rec.data.get("committed_at")),
                    "prediction commit",
                    f"{f.tag} @ {f.frozen.commit[:12]}",
                    "git (committer clock)",
                )
            )
        ev.append(
            Event(f.confirmed_at, "prediction freeze on remote", f.tag, "freeze record" if rec else "no freeze record")
        )
        for e in f.errata:
            ev.append(
                Event(
                    parse_utc(e["committed_at"]), "erratum", f"{e['path']} @ {e['commit'][:12]} (after {f.tag})", "git"
                )
            )
    for t in times:
        name = t.run.path.name
        if t.times_from == "scheduler":
            j = t.job
            ev.append(Event(t.submit, "job submit", f"{j.job_id if j else ''} {name}", "scheduler accounting"))
            ev.append(Event(t.start, "job start", f"{j.job_id if j else ''} {name}", "scheduler accounting"))
            ev.append(Event(t.end, "job end", f"{j.job_id if j else ''} {name}", "scheduler accounting"))
        else:
            ev.append(Event(t.run.created_at, "run start", name, "meta.json"))
        ev.append(Event(t.run.finished_at, "run end", f"{name} ({t.run.status})", "meta.json"))
    far = datetime.max.replace(tzinfo=None)
    return sorted(ev, key=lambda e: (e.at.replace(tzinfo=None) if e.at else far, e.kind))


def format_timeline(tl: Timeline) -> str:
    lines = [f"timeline of {tl.testdir} (UTC)", ""]
    w = max([len(e.kind) for e in tl.events] + [10])
    for e in tl.events:
        lines.append(f"  {iso(e.at) or 'unknown':<32} {e.kind:<{w}}  {e.subject}  [{e.source}]")
    lines += ["", f"registration label: {tl.label.upper()} ({tl.label_reason})"]
    for f in tl.freezes:
        lines.append(f"predictions {f.tag}: {f.overall.text().upper()} ({f.overall.reason})")
        labels: dict[str, int] = {}
        for b in f.by_prediction.values():
            labels[b.text()] = labels.get(b.text(), 0) + 1
        if len(labels) > 1:
            lines.append("  per prediction: " + ", ".join(f"{k}: {v}" for k, v in labels.items()))
        for er in f.errata:
            lines.append(f"  erratum {er['commit'][:12]} to {er['path']} at {er['committed_at']}")
    for n in tl.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
