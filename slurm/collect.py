"""`agentload jobs status|collect MANIFEST`: what the scheduler says, what the jobs left, the verdict.

Collection joins the three records a registered test has (the manifest, the scheduler's accounting
and each run's meta.json) and checks them against each other, so a reader can see from the test
directory alone which jobs ran, when, with what outcome and why (paper App. E.11-E.13; rules
digest §5.2-5.3):

* job states from the scheduler (`squeue`, then `sacct`), or from the local executor's record;
* the run directories, gathered under `<testdir>/runs/` (copied there if a job wrote elsewhere);
* the accounting export (`sacct`: JobID, JobName, Submit, Start, End, State, ExitCode, NodeList,
  Timelimit, Elapsed, Comment, in UTC and local time) in `<testdir>/provenance/accounting.json`
  and `.csv`, taken once every job's row is final, and checked against the manifest: every job
  has its row, with the manifest's comment, job name and time limit and its submit time;
* every job that did not complete, with its reason (the run's own, else the scheduler's state and
  exit code, else the job log's last words);
* the label, recomputed from the manifest and the accounting's submit times;
* then the registered analysis (`analyze --registration`, analysis/registered.py) of the runs.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.recording.schema import RunStatus
from provenance.git import GitError, Repo
from slurm.accounting_export import write_accounting_export
from slurm.exits import EXIT_MEANING
from slurm.manifest import (
    ACCOUNTING_CSV,
    ACCOUNTING_JSON,
    COLLECTION,
    PROVENANCE,
    job_ids,
    label_from_record,
    read_manifest,
    run_meta,
    test_dir,
    write_manifest,
)
from slurm.parsers import TERMINAL_STATES, JobState, normalise_state
from slurm.scheduler import SchedulerError, accounting, job_states, wait_for_accounting


def _log_tail(job: dict[str, Any], lines: int = 3) -> str | None:
    """The job log's last `agentload job:` lines (else its last lines)."""
    for key in ("stderr", "stdout"):
        p = job.get(key)
        if not p:
            continue
        try:
            text = Path(p).read_text(errors="replace").splitlines()
        except OSError:
            continue
        ours = [ln for ln in text if "agentload job:" in ln]
        tail = ours[-lines:] or [ln for ln in text if ln.strip()][-lines:]
        if tail:
            return " | ".join(x.strip() for x in tail)
    return None


def scheduler_states(doc: dict[str, Any]) -> dict[str, JobState]:
    """Each job's state: the scheduler's (slurm) or the local executor's record."""
    if doc["executor"] == "local":
        return {str(j["job_id"]): normalise_state(str(j.get("state") or "")) for j in doc["jobs"] if j.get("job_id")}

    ids = job_ids(doc)
    return job_states(ids) if ids else {}


def job_table(
    doc: dict[str, Any], states: dict[str, JobState], rows: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One line per job: scheduler state, run status and the reason it did not complete."""
    out = []
    base = test_dir(doc)
    for j in doc["jobs"]:
        jid = str(j.get("job_id"))
        run_dir = j.get("superseded_run_dir") or j["run_dir"]  # a resubmitted job's run moved aside
        meta = run_meta(base / run_dir)
        row = (rows or {}).get(jid)
        state = row.state if row is not None else states.get(jid, JobState.UNKNOWN)
        exit_code = row.exit_code if row is not None else j.get("exit_code")
        run_status = meta.get("status") if meta else None
        reason = None
        if run_status != RunStatus.COMPLETED or state != JobState.COMPLETED:
            if state == JobState.TIMEOUT:
                limit = f" ({row.timelimit}, after {row.elapsed})" if row is not None and row.timelimit else ""
                run_why = meta.get("status_reason") if meta else None
                reason = f"the scheduler's time limit{limit} ended the job" + (
                    f"; the run: {run_status}: {run_why}" if run_why else ""
                )
            elif meta and meta.get("status_reason"):
                reason = meta["status_reason"]
            elif state == JobState.CANCELLED:
                reason = "cancelled (scancel) before it wrote a run"
            elif state in (JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN):
                reason = None
            else:
                reason = EXIT_MEANING.get(exit_code or -1)
            if run_status is None and state not in (JobState.PENDING, JobState.RUNNING):
                tail = _log_tail(j)
                reason = (
                    f"{reason or 'no run directory'}; job log: {tail}"
                    if tail
                    else (reason or "no run directory and no job log")
                )
        refusal = (meta or {}).get("refusal") or {}
        out.append(
            {
                "index": j["index"],
                "job_id": jid,
                "arm": j["arm"],
                "rate": j["rate"],
                "seed": j["seed"],
                "state": str(state),
                "exit_code": exit_code,
                "run_status": run_status,
                "refused_by": refusal.get("check"),
                "reason": reason,
                "run_dir": run_dir,
                "superseded_by": j.get("superseded_by"),
            }
        )
    return out


def format_table(table: list[dict[str, Any]]) -> str:
    lines = [f"{'#':>3} {'job':>12} {'arm':<10} {'rate':>6} {'seed':>4}  {'scheduler':<11} {'run':<12} reason"]
    for t in table:
        lines.append(
            f"{t['index']:>3} {t['job_id']:>12} {t['arm']:<10} {t['rate']:>6g} {t['seed']:>4}  {t['state']:<11} "
            f"{t['run_status'] or '-':<12} {t['reason'] or ''}"
            + (f" [resubmitted as {t['superseded_by']}]" if t.get("superseded_by") else "")
        )
    return "\n".join(lines)


def status(manifest: str | Path) -> dict[str, Any]:
    doc = read_manifest(manifest)
    states = scheduler_states(doc)
    return {"manifest": doc["_path"], "registration": doc["registration"]["name"], "jobs": job_table(doc, states)}


def agreement(doc: dict[str, Any], rows: list[Any]) -> list[str]:
    """Where the accounting export and the manifest disagree (empty: they agree)."""
    by_id = {r.job_id: r for r in rows}
    problems: list[str] = []
    limit_s = float(doc["time_limit"]["seconds"])
    for j in doc["jobs"]:
        jid = str(j.get("job_id"))
        r = by_id.get(jid)
        if r is None:
            problems.append(f"job {jid} ({j['arm']} x {j['rate']:g} seed {j['seed']}): no accounting row")
            continue
        if r.comment != doc["comment"]:
            problems.append(f"job {jid}: comment {r.comment!r}, the manifest's {doc['comment']!r}")
        if r.job_name != doc["job_name"]:
            problems.append(f"job {jid}: job name {r.job_name!r}, the manifest's {doc['job_name']!r}")
        if r.timelimit_s != limit_s:
            problems.append(
                f"job {jid}: time limit {r.timelimit!r} ({r.timelimit_s} s), the manifest's "
                f"{doc['time_limit']['slurm']} ({limit_s:.0f} s)"
            )
        sub = j.get("submit_utc")
        if sub and r.submit is not None and r.submit.isoformat() != sub:
            problems.append(f"job {jid}: submit time {r.submit.isoformat()}, the manifest recorded {sub}")
    extra = sorted(set(by_id) - {str(j.get("job_id")) for j in doc["jobs"]})
    if extra:
        problems.append(f"accounting rows for jobs not in the manifest: {extra[:10]}")
    return problems


def _gather(doc: dict[str, Any]) -> list[str]:
    """Copy run directories written outside <testdir>/runs into it; returns what was copied."""
    base = test_dir(doc)
    copied = []
    for j in doc["jobs"]:
        dst = base / j["run_dir"]
        src = Path(j["spec"]["run_dir"])
        if src.resolve() != dst.resolve() and src.is_dir() and not dst.exists():
            shutil.copytree(src, dst)
            copied.append(str(src))
    return copied


def _remote_now(doc: dict[str, Any]) -> dict[str, Any] | None:
    """Ask the remote again (only informative: a later push never makes a label pre-registered)."""
    reg, rem = doc["registration"], doc.get("remote") or {}
    if not reg.get("commit") or rem.get("contains"):
        return None
    try:
        repo = Repo.containing(Path(reg["abs_path"]))
        rc = repo.remote_contains(reg["commit"], rem.get("remote"), rem.get("branch"))
        return {
            "remote": rc.remote,
            "branch": rc.branch,
            "head": rc.remote_head,
            "contains": rc.contains,
            "checked_at": rc.checked_at,
        }
    except (GitError, OSError) as exc:
        return {"error": str(exc)}


Judge = Callable[[dict[str, Any], Path, Callable[[str], None]], dict[str, Any]]


def collect(
    manifest: str | Path, *, wait_s: float = 0.0, judge: Judge | None = None, echo: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Collect a test directory (see the module docstring); writes collection.json and returns it.

    `judge(manifest, test directory, echo)` computes the registered verdict of the collected runs
    (review.registered.collection_verdict; the review is above the cluster, so it is passed in);
    None collects without a verdict."""
    say = echo or (lambda m: None)
    doc = read_manifest(manifest)
    base = test_dir(doc)
    ids = job_ids(doc)
    deadline = time.monotonic() + wait_s
    states = scheduler_states(doc)
    while (
        wait_s > 0
        and any(states.get(i, JobState.UNKNOWN) not in TERMINAL_STATES for i in ids)
        and time.monotonic() < deadline
    ):
        time.sleep(2.0)
        states = scheduler_states(doc)
    pending = [i for i in ids if states.get(i, JobState.UNKNOWN) not in TERMINAL_STATES]
    result: dict[str, Any] = {
        "manifest": doc["_path"],
        "collected_at": _utc(),
        "complete": not pending,
        "pending": pending,
    }
    rows: list[Any] = []
    prov = base / PROVENANCE
    if doc["executor"] == "slurm" and ids:
        try:
            try:
                rows = accounting(ids) if pending else wait_for_accounting(ids, count=len(ids), timeout_s=60.0)
            except TimeoutError:
                rows = accounting(ids)
                result["accounting_note"] = "some rows were not final after 60 s; exported as they stood"
        except SchedulerError as exc:  # no accounting: say so, and collect what the runs hold
            rows = []
            result["accounting_note"] = f"no accounting: {str(exc).splitlines()[0]}"
        write_accounting_export(rows, prov / ACCOUNTING_JSON)
        write_accounting_export(rows, prov / ACCOUNTING_CSV)
        result["accounting"] = {
            "json": str(prov / ACCOUNTING_JSON),
            "csv": str(prov / ACCOUNTING_CSV),
            "rows": len(rows),
            "settled": all(r.settled for r in rows),
        }
        result["agreement"] = agreement(doc, rows)
        submit_times = [r.submit for r in rows] if rows else [j.get("submit_utc") for j in doc["jobs"]]
    else:
        write_manifest(
            {"source": "local executor records (no scheduler)", "jobs": doc["jobs"]}, prov / "local-jobs.json"
        )
        result["accounting"] = {
            "json": None,
            "csv": None,
            "rows": 0,
            "note": "local executor: no scheduler accounting; see provenance/local-jobs.json",
        }
        result["agreement"] = []
        submit_times = [j.get("submit_utc") for j in doc["jobs"]]
    result["copied_runs"] = _gather(doc)
    table = job_table(doc, states, {r.job_id: r for r in rows} if rows else None)
    result["jobs"] = table
    result["not_completed"] = [
        t
        for t in table
        if not t["superseded_by"] and (t["state"] != JobState.COMPLETED or t["run_status"] != RunStatus.COMPLETED)
    ]
    result["resubmitted"] = [t for t in table if t["superseded_by"]]
    remote_now = _remote_now(doc)
    result["remote_now"] = remote_now
    result["label"] = label_from_record(doc, submit_times, remote_now).to_json()
    result["label"]["submit_time_source"] = doc.get("submit_time_source")
    if judge is not None:
        result["analysis"] = judge(doc, base, say)
    write_manifest(result, base / COLLECTION)
    return result


def _utc() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def format_collection(res: dict[str, Any]) -> str:
    lab = res["label"]
    acc = res["accounting"]
    lines = [
        f"collected {res['manifest']}"
        + ("" if res["complete"] else f" (NOT complete: {len(res['pending'])} job(s) still pending or running)"),
        f"  accounting  {acc.get('rows', 0)} row(s) -> {acc.get('json') or acc.get('note')}",
        "  agreement   "
        + ("the export agrees with the manifest" if not res["agreement"] else "; ".join(res["agreement"])),
        f"  label       {lab['label']}: {lab['reason']} (submit times: {lab.get('submit_time_source')})",
    ]
    if res["not_completed"]:
        lines.append(f"  {len(res['not_completed'])} job(s) not completed:")
        for t in res["not_completed"]:
            lines.append(
                f"    {t['job_id']} {t['arm']} x {t['rate']:g} seed {t['seed']}: {t['state']}"
                f"{' exit ' + str(t['exit_code']) if t['exit_code'] not in (None, 0) else ''}, run "
                f"{t['run_status'] or '-'}: {t['reason']}"
            )
    for t in res.get("resubmitted") or []:
        lines.append(
            f"  resubmitted {t['job_id']} {t['arm']} x {t['rate']:g} seed {t['seed']} as job {t['superseded_by']} "
            f"(its run never started: {t['reason']}; kept in {t['run_dir']})"
        )
    an = res.get("analysis")
    if an:
        lines.append(
            f"  verdict     {an.get('verdict')}"
            + (
                f" ({an['runs_counted']} run(s) counted; judged by {an['judged_by']['commit']}, "
                f"{an['judged_by']['mode']})"
                if an.get("ran")
                else f": not analysed ({an.get('reason')})"
            )
        )
    return "\n".join(lines)


def dump(res: dict[str, Any]) -> str:
    return json.dumps(res, indent=2, default=str)
