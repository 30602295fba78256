"""Where a test stands (`agentload status TESTDIR`): the registration and its label, predictions
frozen or not, the jobs as the scheduler sees them, the runs bound, the verdict if scored, and the
provenance breaks. Plain text or JSON.

Why a separate command: a registered test passes through several hands (fill, freeze, submit,
collect, judge, verify) and each leaves a record in the test directory. Before judging, a user
needs to know which steps have happened and which records disagree, without knowing which file
each step writes. Every fact here is read from those records or asked of the scheduler and git;
nothing is taken from the user. A step that has not happened is reported as such, not as an error.

Job categories (from the scheduler's state, `slurm.scheduler.job_states`; from the accounting
export when the scheduler cannot be asked):

  pending  waiting to start (PENDING, REQUEUED, ...)
  running  started and not ended (RUNNING, COMPLETING, SUSPENDED, ...)
  done     COMPLETED, and its run did not refuse
  failed   ended any other way (FAILED, TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY, ...)
  refused  the job's run directory records status REFUSED: the job script's enforcement refused
           to run it (a registration, plan or cell that does not match), whatever the exit state
  unknown  neither the scheduler nor the accounting export knows the job

The status is typed (review/status_model.py); `TestStatus.to_json()` is what `status --json` prints.
An exploratory test (no registration binds its runs, or an EXPLORATORY one does) shows its
provenance as "not registered (exploratory)": that is what the test is, not a break.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.recording.schema import RunStatus
from prereg.labels import label_now
from review.binding import bind_run
from review.status_model import (
    CATEGORIES,
    FreezeLine,
    JobCategory,
    JobLine,
    JobsStatus,
    PredictionsStatus,
    ProvenanceStatus,
    RegistrationStatus,
    RunsStatus,
    ScoreLine,
    TestStatus,
    UnboundRun,
    VerdictStatus,
)
from review.testdir import PRESENT, TestDir
from slurm.parsers import PENDING_STATES, RUNNING_STATES, JobState, normalise_state
from slurm.scheduler import SchedulerError, job_states

__all__ = ["CATEGORIES", "TestStatus", "collect_status", "format_status", "job_category"]


def job_category(state: str | None, run_status: str | None) -> JobCategory:
    """A job's category from its scheduler state (raw or normalised) and its run's recorded status."""
    if run_status == RunStatus.REFUSED:
        return JobCategory.REFUSED
    if state is None:
        return JobCategory.UNKNOWN
    s = normalise_state(state)
    if s in PENDING_STATES:
        return JobCategory.PENDING
    if s in RUNNING_STATES:
        return JobCategory.RUNNING
    if s == JobState.COMPLETED:
        return JobCategory.DONE
    return JobCategory.FAILED


def _scheduler_states(ids: list[str], runner: Any = None) -> tuple[dict[str, JobState] | None, str]:
    try:
        return job_states(ids, runner=runner), "scheduler (squeue, then sacct)"
    except SchedulerError as exc:
        return None, f"the scheduler could not be asked ({str(exc).splitlines()[0]})"
    except OSError as exc:
        return None, f"the scheduler could not be asked ({exc})"


def jobs_status(td: TestDir, *, ask_scheduler: bool = True, runner: Any = None) -> JobsStatus:
    """Each job of the submission manifest with its state and category, and the counts."""
    if not td.manifest.ok:
        return JobsStatus(td.manifest.state, td.manifest.note, None)
    man = td.manifest.value
    by_dir = {r.name: r for r in td.runs}
    ids = [j.job_id for j in man.jobs]
    states: dict[str, Any] | None = None
    source, notes = "none", []
    if ask_scheduler and ids:
        states, source = _scheduler_states(ids, runner)
        if states is None:
            notes.append(source)
    if states is None and td.accounting.ok:
        states = {jid: str(row.state) for jid, row in td.accounting.value.items() if row.state}
        source = "accounting export (provenance/accounting.json)"
    elif states is None and td.accounting.state != "absent":
        notes.append(f"accounting export not read: {td.accounting.note}")
    if states is None:
        states, source = {}, "none"
    out = JobsStatus(PRESENT, "", source)
    raw_jobs = man.raw.get("jobs") or []
    for i, j in enumerate(man.jobs):
        raw = raw_jobs[i] if i < len(raw_jobs) and isinstance(raw_jobs[i], dict) else {}
        run = by_dir.get(Path(j.run_dir).name) if j.run_dir else None
        run_status = run.status if run else None
        if raw.get("refused") or str(raw.get("status", "")).upper() == RunStatus.REFUSED:
            run_status = RunStatus.REFUSED
        tasks = {k: v for k, v in states.items() if k.startswith(j.job_id + "_")} if j.job_id not in states else {}
        for jid, st in [(j.job_id, states.get(j.job_id))] if not tasks else sorted(tasks.items()):
            cat = job_category(st, run_status)
            out.counts[cat] += 1
            out.jobs.append(JobLine(jid, j.arm, j.rate, j.seed, j.run_dir, st, run_status, cat))
    out.note = "; ".join(notes)
    return out


def registration_status(td: TestDir) -> RegistrationStatus:
    """The registration's identity and status, and its label: from the record once jobs were
    submitted (provenance.timeline), else what jobs submitted now would get (prereg.labels)."""
    ref = td.registration_ref
    piece = td.registration
    out = RegistrationStatus(piece.state, piece.note, ref, piece.path)
    if piece.ok:
        reg = piece.value
        out.name, out.status, out.sha256, out.test = reg.name, reg.status, reg.sha256, reg.test
        out.status_reasons = list(reg.status_reasons)
        if ref and ref.get("sha256") and ref["sha256"] != reg.sha256:
            out.mismatch = f"the file now hashes to {reg.sha256}, but the {ref['source']} binds {ref['sha256']}"
        hint = td.registration_hint
        if (
            hint is not None
            and ref
            and ref["source"] != "command line (--registration)"
            and Path(piece.path or "").resolve() != hint
        ):
            out.mismatch = f"--registration {hint} is not the registration the {ref['source']} names ({ref['path']})"
    tl = td.timeline
    submitted = td.manifest.ok or any(r.meta for r in td.runs)
    if tl.ok and submitted:
        out.label, out.label_reason = tl.value.label, tl.value.label_reason
        out.label_basis = "the record (provenance.timeline)"
    elif piece.ok and piece.path is None:
        out.label_reason = "no label: the registration was not read from a file"
    elif piece.ok and piece.path is not None:
        try:
            lab, facts = label_now(piece.path, piece.value.status)
            out.label, out.label_reason = lab.label, lab.reason
            out.label_basis = "jobs submitted now (prereg.labels.label_now)"
            out.git = {"state": facts.state, "commit": facts.commit, "on_remote": facts.on_remote, "clean": facts.clean}
        except Exception as exc:  # outside a repository, or no git: the label cannot be computed
            out.label, out.label_reason, out.label_basis = None, f"no label: {exc}", None
    else:
        out.label = "exploratory" if ref is None else None
        out.label_reason = (
            "no registration binds the runs" if ref is None else f"the registration cannot be read: {piece.note}"
        )
    return out


def predictions_status(td: TestDir) -> PredictionsStatus:
    """Freezes found for the test (with their blindness from the timeline) and scored reports."""
    freezes: list[FreezeLine] = []
    tl = td.timeline
    if tl.ok:
        for f in tl.value.freezes:
            freezes.append(
                FreezeLine(f.tag, _iso(f.confirmed_at), f.overall.text(), f.overall.reason, errata=len(f.errata))
            )
    elif td.freeze_records:
        freezes = [FreezeLine(p.stem, None, None, f"timeline unavailable: {tl.note}") for p in td.freeze_records]
    scored: list[ScoreLine] = []
    for s in td.scores:
        if not s.ok:
            scored.append(ScoreLine(s.path, error=s.note))
            continue
        rep = s.value
        n = {"hit": 0, "miss": 0, "other": 0}
        for f in rep.get("scores") or []:
            for x in f.get("scored") or []:
                n[x.get("result") if x.get("result") in ("hit", "miss") else "other"] += 1
        scored.append(
            ScoreLine(
                s.path,
                tag=rep.get("tag"),
                hits=n["hit"],
                misses=n["miss"],
                other=n["other"],
                blindness=[f.get("blindness") for f in rep.get("freezes") or []],
                problems=rep.get("problems") or [],
            )
        )
    frozen = bool(freezes)
    note = (
        ""
        if frozen
        else "no predictions frozen for this test (no freeze record in provenance/freezes/ or the repository's "
        "prereg/freezes/)"
    )
    return PredictionsStatus(frozen, freezes, scored, note)


def runs_status(td: TestDir) -> RunsStatus:
    """Runs found, how many are bound to the registration (analysis.registered.bind_run), which
    registered arm x rate x seed have no bound run."""
    by_status: dict[str, int] = {}
    for r in td.runs:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    out = RunsStatus(
        found=len(td.runs),
        by_status=by_status,
        unreadable=[{"run_dir": str(r.path), "error": r.error} for r in td.runs if r.error],
        shared=[r.name for r in td.runs if r.meta and r.meta.get("shared_simulation")],
    )
    if not td.registration.ok:
        out.note = "binding not checked: " + (td.registration.note or "no registration")
        return out
    reg = td.registration.value
    commit = (td.registration_ref or {}).get("commit")
    bound_keys = set()
    n = 0
    for r in td.runs:
        b = bind_run(r.path, reg, td.repo, commit)
        if b.bound:
            n += 1
            bound_keys.add((str(b.arm).upper(), round(float(b.rate or 0), 6), b.seed))
        else:
            out.unbound.append(UnboundRun(str(r.path), b.reasons))
    grid = [(a.upper(), round(m, 6), s) for a in reg.arms for m in reg.multiples() for s in reg.seeds]
    out.bound, out.registered = n, len(grid)
    out.missing = [f"{a} r{m:g} s{s}" for a, m, s in grid if (a, m, s) not in bound_keys]
    return out


def verdict_status(td: TestDir) -> VerdictStatus:
    v = td.verdict
    if not v.ok:
        return VerdictStatus(v.state, v.path, note=v.note)
    d = v.value
    reg = d.get("registered") or {}
    out = VerdictStatus(
        PRESENT,
        v.path,
        verdict=d.get("verdict"),
        rule=d.get("rule"),
        registered=bool(reg),
        decisive=bool(reg.get("decisive")) if reg else False,
        judged_by=(reg.get("judged_by") or {}).get("commit") if reg else None,
        kill_triggered=[k["id"] for k in reg.get("kill_conditions", []) if k.get("triggered") is True] if reg else [],
        rates=[
            {"rate": r.get("rate"), "verdict": r.get("verdict"), "reason": r.get("reason")}
            for r in d.get("rates") or []
        ],
        groups=[
            {"group": g.get("group"), "outcome": g.get("outcome"), "reason": g.get("reason")}
            for g in d.get("groups") or []
        ],
        runs_judged=len(d.get("runs") or []),
        others=[str(p) for p in td.verdicts[1:]],
    )
    newest = max((Path(r.path / "meta.json").stat().st_mtime for r in td.runs if r.meta), default=None)
    if newest is not None and v.path is not None and newest > Path(v.path).stat().st_mtime + 1:
        out.stale = "a run changed after this verdict was written: score again"
    return out


def provenance_status(td: TestDir) -> ProvenanceStatus:
    v = td.verification
    if not v.ok:
        return ProvenanceStatus(v.state, note=v.note)
    ver = v.value
    return ProvenanceStatus(
        PRESENT,
        ok=ver.ok,
        checks=len(ver.checks),
        breaks=[{"area": c.area, "name": c.name, "detail": c.detail} for c in ver.breaks],
        skipped=list(ver.skipped),
        notes=list(ver.timeline.notes) if ver.timeline else [],
        exploratory=ver.exploratory,
    )


def collect_status(td: TestDir, *, ask_scheduler: bool = True, runner: Any = None) -> TestStatus:
    """Everything `agentload status` reports (`.to_json()`: what `status --json` prints)."""
    return TestStatus(
        testdir=str(td.path),
        test=td.test_name,
        registration=registration_status(td),
        predictions=predictions_status(td),
        jobs=jobs_status(td, ask_scheduler=ask_scheduler, runner=runner),
        runs=runs_status(td),
        verdict=verdict_status(td),
        provenance=provenance_status(td),
    )


def _iso(t: Any) -> str | None:
    return None if t is None else t.isoformat()


def _rate(x: Any) -> str:
    return "?" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:g}"


def provenance_text(pv: ProvenanceStatus) -> str:
    """The provenance line's answer: holds, N break(s), or not registered (exploratory)."""
    if pv.exploratory:
        extra = f"; {len(pv.breaks)} other check(s) broke" if pv.breaks else ""
        return f"not registered (exploratory): {pv.exploratory}{extra}"
    return "holds" if pv.ok else f"{len(pv.breaks)} break(s)"


def format_status(st: TestStatus) -> str:
    """The status as a reader scans it: one block per step, the plain answer first."""
    L = [f"test {st.test or '(unnamed)'} in {st.testdir}", ""]
    r = st.registration
    if r.state == PRESENT:
        L.append(f"registration  {r.name} ({r.status}), SHA-256 {r.sha256}")
        L.append(f"              file {r.path}" + (f"; bound by the {r.ref['source']}" if r.ref else ""))
        if r.status_reasons:
            L.append(f"              why {r.status}: {'; '.join(r.status_reasons)}")
        if r.mismatch:
            L.append(f"              MISMATCH: {r.mismatch}")
    else:
        L.append(f"registration  {r.state}: {r.note}")
    if r.label:
        L.append(f"label         {r.label.upper()} ({r.label_reason}) [{r.label_basis}]")
    else:
        L.append(f"label         none ({r.label_reason})")
    p = st.predictions
    if p.frozen:
        for f in p.freezes:
            L.append(
                f"predictions   frozen {f.tag}, on the remote {f.confirmed_at or 'not recorded'}: {f.blindness or '?'}"
            )
    else:
        L.append(f"predictions   not frozen: {p.note}")
    for s in p.scored:
        L.append(
            f"              scored {s.tag or s.path}: "
            + (
                s.error
                if s.error is not None
                else f"{s.hits} hits, {s.misses} misses, {s.other} without a call or outcome"
            )
        )
    j = st.jobs
    if j.state == PRESENT:
        c = j.counts
        L.append(
            f"jobs          {sum(c.values())}: "
            + ", ".join(f"{c[k]} {k}" for k in JobCategory if c[k] or k != JobCategory.UNKNOWN)
            + f" [from {j.source}]"
        )
        if j.note:
            L.append(f"              {j.note}")
        for job in j.jobs:
            if job.category in (JobCategory.FAILED, JobCategory.REFUSED, JobCategory.UNKNOWN):
                L.append(
                    f"              job {job.job_id} {job.arm} r{_rate(job.rate)} s{job.seed}: {job.category} "
                    f"(state {job.state}, run {job.run_status})"
                )
    else:
        L.append(f"jobs          none: {j.note}")
    ru = st.runs
    by = ", ".join(f"{v} {k}" for k, v in sorted(ru.by_status.items())) or "none"
    if ru.bound is not None:
        L.append(f"runs          {ru.found} found ({by}); {ru.bound} bound of {ru.registered} registered")
        if ru.missing:
            L.append(f"              no bound run for: {', '.join(ru.missing)}")
        for u in ru.unbound:
            L.append(f"              not bound {Path(u.run_dir).name}: {'; '.join(u.reasons)}")
    else:
        L.append(f"runs          {ru.found} found ({by}); {ru.note or ''}")
    if ru.shared:
        L.append(
            f"              {len(ru.shared)} of them copies of another test's run with the same inputs, not played "
            "again (shared_simulation in meta.json)"
        )
    v = st.verdict
    if v.state == PRESENT:
        kind = (
            ("registered, decisive" if v.decisive else "registered, not decisive") if v.registered else "not registered"
        )
        L.append(f"verdict       {v.verdict} ({kind}; rule {v.rule}; {v.runs_judged} runs judged) {v.path}")
        for x in v.rates:
            L.append(f"              {_rate(x['rate'])} x lambda_ref: {x['verdict']} ({x['reason']})")
        for g in v.groups:
            L.append(f"              {g['group']}: {g['outcome']} ({g['reason']})")
        if v.kill_triggered:
            L.append(f"              KILL CONDITIONS TRIGGERED: {', '.join(v.kill_triggered)}")
        if v.stale:
            L.append(f"              STALE: {v.stale}")
    else:
        L.append(f"verdict       {v.note}")
    pv = st.provenance
    if pv.state == PRESENT:
        L.append(
            f"provenance    {provenance_text(pv)} ({pv.checks} checks"
            + (f", {len(pv.skipped)} skipped)" if pv.skipped else ")")
        )
        for b in pv.breaks:
            L.append(f"              BREAK [{b['area']}] {b['name']}" + (f": {b['detail']}" if b["detail"] else ""))
    else:
        L.append(f"provenance    not verified: {pv.note}")
    return "\n".join(L)
