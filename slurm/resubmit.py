"""`agentload jobs resubmit MANIFEST`: submit again, with nothing changed, the jobs of a registered
test whose run never started.

Why: a job can end before its run sends a single turn: its engine's speed pin could not settle on a
noisy host, its engine did not start, a pre-run check refused it. Such a job says nothing about the
arm, but the test stays INCOMPLETE without it. The paper's own record does this once (App. E: the
E0a job 17264061 failed its pre-run time check, no run started, and it was resubmitted as 17264093
with nothing else changed, and reported). A job whose run started is never resubmitted, whatever
its outcome: choosing which started runs to repeat would be choosing outcomes.

What it does, and what stays on record:
* a job is resubmittable when the scheduler has finished it and its run's meta.json says REFUSED or
  FAILED with no turn sent and every record table empty (`never_started`);
* its run directory moves to `<testdir>/superseded/<run>.job-<id>/` (nothing is deleted);
* the same job specs are submitted again, with the manifest's executor, checkout, time limit,
  comment, job name and job options, as one new array;
* the manifest keeps every job it had, the superseded one marked `superseded_by` (its new job id)
  with `superseded_run_dir`; the new one is appended with `resubmission_of`; `resubmissions` lists
  each resubmission (when, which jobs, why). The label's first submission stays the first job's.

`jobs collect` counts the newest attempt of each run; `provenance verify` checks that every
superseded job had sent nothing (review/verify.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import AgentloadError
from harness.recording.schema import SUPERSEDED_DIR
from slurm.collect import scheduler_states
from slurm.executors import run_local, submit_slurm
from slurm.job import JobSpec
from slurm.job_options import JobOptions
from slurm.manifest import JOBS, MANIFEST, never_started, read_manifest, run_meta, test_dir, write_manifest
from slurm.parsers import TERMINAL_STATES, JobState
from slurm.submit import manifest_executor, scheduler_submit_times


class ResubmitRefused(AgentloadError):
    """Nothing to resubmit, or a job that may not be (the message says which and why)."""


@dataclass(frozen=True)
class Candidate:
    """A job of the manifest and whether it may be submitted again."""

    index: int  # position in the manifest's jobs
    job_id: str
    run_dir: str
    ok: bool
    why: str


def candidates(doc: dict[str, Any], states: dict[str, JobState]) -> list[Candidate]:
    """Every current (not superseded) job whose scheduler state is final, with its verdict."""
    base = test_dir(doc)
    out = []
    for i, j in enumerate(doc["jobs"]):
        jid = str(j.get("job_id"))
        if j.get("superseded_by") or j.get("job_id") is None:
            continue
        state = states.get(jid, JobState.UNKNOWN)
        if state not in TERMINAL_STATES:
            out.append(Candidate(i, jid, j["run_dir"], False, f"the scheduler says {state}: not finished"))
            continue
        ok, why = never_started(run_meta(base / j["run_dir"]))
        out.append(Candidate(i, jid, j["run_dir"], ok, why))
    return out


Submit = Callable[[dict[str, Any], Sequence[JobSpec]], list[dict[str, Any]]]


def _submit_like_the_manifest(doc: dict[str, Any], specs: Sequence[JobSpec]) -> list[dict[str, Any]]:
    """The specs submitted as the manifest's jobs were: same executor, checkout, limit, names, options."""
    base = test_dir(doc)
    root = Path(doc["checkout"]["path"])
    job = JobOptions(**(doc.get("arguments") or {}).get("job", {}))
    if doc["executor"] == "slurm":
        return submit_slurm(specs, manifest_executor(doc, job))
    recs = run_local(specs, base / JOBS, checkout=root, python=job.python, env=job.job_env, parallel=job.parallel or 1)
    for r in recs:
        r["submit_utc"] = r.get("submitted_at_client")
    return recs


def resubmit(
    manifest: str | Path,
    *,
    indices: Sequence[int] | None = None,
    dry_run: bool = False,
    states: dict[str, JobState] | None = None,
    submit: Submit | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Resubmit the jobs that never started (all of them, or those at the given manifest `indices`);
    returns the resubmission's record. `states` and `submit` default to the scheduler's."""
    say = echo or (lambda m: None)
    doc = read_manifest(manifest)
    if states is None:
        states = scheduler_states(doc)
    cands = candidates(doc, states)
    if indices is not None:
        by_index = {c.index: c for c in cands}
        bad = [i for i in indices if i not in by_index]
        if bad:
            raise ResubmitRefused(f"--job {bad}: no current job at that index (0-{len(doc['jobs']) - 1})")
        refused = [c for c in (by_index[i] for i in indices) if not c.ok]
        if refused:
            raise ResubmitRefused(
                "resubmission refused: " + "; ".join(f"job {c.job_id} ({c.run_dir}): {c.why}" for c in refused)
            )
        chosen = [by_index[i] for i in indices]
    else:
        chosen = [c for c in cands if c.ok]
    if not chosen:
        raise ResubmitRefused(
            "nothing to resubmit: no finished job of this test ended before its run started"
            + "".join(f"\n  job {c.job_id} ({c.run_dir}): {c.why}" for c in cands if not c.ok)
        )
    for c in chosen:
        say(f"job {c.job_id} ({c.run_dir}): {c.why}")
    record: dict[str, Any] = {
        "at": datetime.now(UTC).isoformat(timespec="microseconds"),
        "jobs": [{"job_id": c.job_id, "run_dir": c.run_dir, "why": c.why} for c in chosen],
        "dry_run": dry_run,
    }
    if dry_run:
        return record
    base = test_dir(doc)
    specs = []
    for n, c in enumerate(chosen):
        old = doc["jobs"][c.index]
        moved = Path(SUPERSEDED_DIR) / f"{Path(c.run_dir).name}.job-{c.job_id}"
        (base / SUPERSEDED_DIR).mkdir(exist_ok=True)
        shutil.move(str(base / c.run_dir), str(base / moved))
        old["superseded_run_dir"] = moved.as_posix()
        spec = JobSpec.from_json({**old["spec"], "index": len(doc["jobs"]) + n})
        specs.append(spec)
    doc_out = {k: v for k, v in doc.items() if k != "_path"}
    write_manifest(doc_out, base / MANIFEST)  # the moves are on record before the scheduler is asked
    records = (submit or _submit_like_the_manifest)(doc, specs)
    if doc["executor"] == "slurm":
        times = scheduler_submit_times([r["job_id"] for r in records])
        for r in records:
            r["submit_utc"] = times.get(r["job_id"])
    for c, spec, rec in zip(chosen, specs, records):
        old = doc["jobs"][c.index]
        old["superseded_by"] = rec["job_id"]
        doc["jobs"].append(
            {
                **{k: old[k] for k in ("arm", "rate", "seed", "plan_sha256", "run_dir")},
                **rec,
                "index": spec.index,
                "spec": spec.to_json(),
                "resubmission_of": c.job_id,
            }
        )
        say(f"  resubmitted as job {rec['job_id']}")
    record["new_jobs"] = [r["job_id"] for r in records]
    doc.setdefault("resubmissions", []).append(record)
    write_manifest({k: v for k, v in doc.items() if k != "_path"}, base / MANIFEST)
    return record
