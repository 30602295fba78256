"""`agentload submit REG.yaml`: every arm x rate x seed of a registered test, one job each.

What the submission does, and why each step (paper App. E.5, E.11, E.12; rules digest §2, §5.2):

1. Checks the registration exactly as `prereg check` does (prereg/check.py): its hash and status,
   its inputs, that it and the tree are committed, the plans the configs generate now. A refusal
   stops the submission, naming every problem. `--exploratory` accepts an EXPLORATORY registration
   and an uncommitted one or a dirty tree (its runs are exploratory, never decisive); a changed
   input or plan is refused all the same.
   A registration whose rule can only FAIL by design (prereg/decidable.py: e.g. CAPPED required
   RECOVERED where its drain cannot fit the budget) is refused, with the reason and what design
   would be decisive, unless `--accept-undecidable` (recorded in the manifest's check block).
2. Asks the remote itself whether its branch holds the registration's commit, and records the
   answer with the remote head and the time it was asked: "pre-registered" needs that answer
   before the scheduler's first submit time.
3. Computes one time limit for the jobs from the protocol (slurm/budget.py), or takes `--time`;
   a limit too short for the need is submitted anyway (with a warning), and the jobs refuse it.
4. Submits one job per registered arm x rate x seed, in the registration's order, as one job
   array through submitit (or local processes with `--executor local`), the comment carrying the
   registration's name and SHA-256, and writes the manifest (slurm/manifest.py) with the job ids in
   order, the registration path, SHA-256 and commit, the remote's answer, the plan hashes, the
   arguments, the limit and the submit times, the scheduler's as soon as its accounting has them.
5. Computes the label from that record (prereg.labels.label_for), never from anyone's word.

`--dry-run` does steps 1-3 and prints what would be submitted, submitting nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import AgentloadError
from prereg.check import check_registration
from prereg.decidable import decisive_hints, undecidable_reasons
from prereg.registration import load_registration
from provenance.git import GitError, Repo
from provenance.portable import remote_label
from runs.arms import run_name
from slurm.budget import job_time_limit, parse_time_minutes, run_budget
from slurm.checks import Refused, code_check
from slurm.executors import run_local, sbatch_script, slurm_executor, submit_slurm
from slurm.gpus import GPUS_PER_JOB, gres_gpus, needs_gpu
from slurm.job import CODE_ROOT, JobSpec
from slurm.job_options import JobOptions
from slurm.manifest import FORMAT, FORMAT_VERSION, JOBS, MANIFEST, RUNS, label_from_record, write_manifest
from slurm.scheduler import SchedulerError, accounting

#: Refusals of `prereg check` that an exploratory submission may go past (its runs carry the
#: exploratory label, which is what these facts decide).
EXPLORATORY_WAIVES = ("commit:", "tree:", "remote:", "git:")


class SubmitRefused(AgentloadError):
    """The submission is refused; the message lists every reason."""


@dataclass
class SubmitOptions:
    """The command line of `agentload submit`, as data (recorded in the manifest); `job` holds what
    every job asks the scheduler for, the same option set as `--executor slurm`'s."""

    executor: str = "slurm"  # slurm | local
    engine: str | None = None  # default: the registered cell's engine
    time_scale: float | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    exploratory: bool = False
    out: str | None = None
    remote: str | None = None
    branch: str | None = None
    job: JobOptions = field(default_factory=JobOptions)
    accept_undecidable: bool = False  # submit a registration that can only FAIL by design (prereg/decidable.py)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _utc() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _check(reg_path: Path, opts: SubmitOptions) -> tuple[Any, list[str]]:
    """`prereg check`, with what --exploratory waives split off; raises SubmitRefused otherwise."""
    res = check_registration(reg_path, remote=opts.remote, branch=opts.branch, allow_exploratory=opts.exploratory)
    waived = [r for r in res.refusals if opts.exploratory and r.startswith(EXPLORATORY_WAIVES)]
    left = [r for r in res.refusals if r not in waived]
    if left:
        hint = (
            ""
            if opts.exploratory
            else " (--exploratory submits an uncommitted registration or a dirty tree as exploratory runs)"
        )
        raise SubmitRefused(
            f"submission refused: {reg_path} ({res.name}, SHA-256 {res.sha256}):\n"
            + "\n".join(f"  - {r}" for r in left)
            + hint
        )
    return res, waived


def _decidable(path: Path, reg: Any, opts: SubmitOptions, say: Callable[[str], None]) -> list[str]:
    """Refuse a registration whose rule can only FAIL by design (prereg/decidable.py), saying why and
    what design would be decisive, unless --accept-undecidable; returns the reasons accepted."""
    reasons = undecidable_reasons(reg)
    if not reasons:
        return []
    if opts.accept_undecidable:
        for r in reasons:
            say(f"accepted undecidable: {r}")
        return reasons
    hints = decisive_hints(reg)
    design = reg.fill.get("design") or {}
    prop = (design.get("proposal") or {}).get("design")
    tmpl = (reg.fill.get("template") or {}).get("path", "TEMPLATE")
    inputs = sorted({str(Path(i.path).parent) for i in reg.inputs if i.role in ("stage-c", "e0a", "e0b")})
    lines = [
        f"submission refused: {path} ({reg.name}) is undecidable by design: its jobs would spend the engine on a test "
        "that cannot pass:"
    ]
    lines += [f"  - {r}" for r in reasons]
    if hints:
        lines.append(
            "what would make the drain fit, by the registration's own formulas (whether its burst still traps is for "
            "the design step to say):"
        )
        lines += [f"  - {h}" for h in hints]
    if prop:
        lines.append(
            f"  - the bound design record {design.get('path')} proposes {prop} "
            f"({(design.get('proposal') or {}).get('engine_hours')} engine-hours)"
        )
    lines.append(
        f"  - `agentload prereg design --inputs {inputs[0] if inputs else 'INPUTS'} --test {tmpl} --cost COSTFILE` "
        "searches the protocol's "
        "knobs for the cheapest decisive design before anything is run"
    )
    lines.append("(--accept-undecidable submits it anyway; the manifest records the reasons)")
    raise SubmitRefused("\n".join(lines))


def _checkout(reg_path: Path, exploratory: bool) -> tuple[Path, str]:
    """The code checkout the jobs run in (the registration's repository) and the registration's
    path inside it."""
    try:
        repo = Repo.containing(reg_path)
        root = repo.path.resolve()
        rel = repo.relpath(reg_path)
    except GitError:
        if not exploratory:
            raise SubmitRefused(f"submission refused: {reg_path} is not in a git working tree") from None
        return CODE_ROOT, str(reg_path.resolve())
    if not (root / "slurm" / "job.py").is_file():
        raise SubmitRefused(
            f"submission refused: the registration's repository {root} holds no agentload code (slurm/job.py); "
            "jobs run the code of the checkout that holds the registration"
        )
    return root, rel


def _code_matches(root: Path, reg_path: Path, commit: str | None) -> None:
    """Refuse now what every job would refuse on the node: code changed since the registration's
    commit (Decision 19; slurm.checks.code_check, the job's own check). Found at submission, it costs
    nothing; found by the jobs, it costs a scheduler slot each and a submission that can never be
    completed, since its jobs have been submitted."""
    try:
        code_check(root, reg_path, commit, exploratory=False)
    except Refused as exc:
        short = (commit or "")[:12]
        raise SubmitRefused(
            f"submission refused: every job would refuse to run: {exc.reason}. A registration binds the code of "
            f"its commit: submit it from a checkout of that commit (git worktree add DIR {short or 'COMMIT'}, "
            "then submit DIR's copy of the registration), or register the test anew with this code (a registration "
            "file committed after these changes; refilling this one changes no byte, so its commit stays the old one)"
        ) from None


def plan_submission(
    reg_path: str | Path, opts: SubmitOptions, *, echo: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Steps 1-3: the manifest as it will be written, with every job's spec, nothing submitted."""
    say = echo or (lambda m: None)
    p = Path(reg_path).resolve()
    reg = load_registration(p)
    undecidable = _decidable(
        p, reg, opts, say
    )  # first: no git state makes a test that cannot pass worth its engine time
    res, waived = _check(p, opts)
    for w in waived:
        say(f"exploratory: {w}")
    root, rel = _checkout(p, opts.exploratory)
    g = res.git or {}
    committed = g.get("state") == "committed"
    if committed and not opts.exploratory:
        _code_matches(root, p, g.get("commit"))
    engine = opts.engine or reg.cell.engine.name
    try:
        budget = run_budget(reg.protocol.duration, reg.allowances, engine, opts.time_scale)
        limit = job_time_limit(budget, parse_time_minutes(opts.job.time) if opts.job.time else None)
    except ValueError as exc:
        raise SubmitRefused(f"submission refused: {exc}") from None
    if not limit.fits:
        say(
            f"warning: --time {opts.job.time} ({limit.seconds:.0f} s) is shorter than a job needs "
            f"({limit.needed_s:.0f} s + "
            f"{limit.warning_lead_s} s warning lead); every job will refuse to run"
        )
    out = Path(opts.out) if opts.out else Path("results") / "submissions" / f"{reg.name}-{_stamp()}"
    out = out.resolve()
    if (out / MANIFEST).exists() and not opts.dry_run:
        raise SubmitRefused(f"submission refused: {out / MANIFEST} exists; give a fresh --out")
    specs = []
    for i, pl in enumerate(reg.plans):
        specs.append(
            JobSpec(
                registration=rel,
                sha256=reg.sha256,
                arm=pl.arm,
                rate=float(pl.rate),
                seed=int(pl.seed),
                run_dir=str(out / RUNS / run_name(pl.arm, pl.rate, pl.seed)),
                engine=engine,
                time_scale=budget.time_scale,
                engine_options=dict(opts.engine_options),
                commit=g.get("commit") if committed else None,
                exploratory=opts.exploratory,
                warning_lead_s=float(limit.warning_lead_s),
                index=i,
            )
        )
    comment = f"agentload registration {reg.name} sha256={reg.sha256}"
    gpus = gres_gpus(opts.job.gres) if opts.job.gres else (GPUS_PER_JOB if needs_gpu(reg.cell, engine) else 0)
    cost = {
        "jobs": len(specs),
        "need_s": budget.needed_s,
        "limit_s": limit.seconds,
        "gpus_per_job": gpus,
        "gpu_hours": len(specs) * budget.needed_s * gpus / 3600.0,
        "gpu_hours_limit": len(specs) * limit.seconds * gpus / 3600.0,
    }
    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": _utc(),
        "executor": opts.executor,
        "dry_run": opts.dry_run,
        "exploratory": opts.exploratory,
        "registration": {
            "name": reg.name,
            "path": rel,
            "abs_path": str(p),
            "sha256": reg.sha256,
            "status": reg.status,
            "test": reg.test,
            "commit": g.get("commit") if committed else None,
            "commit_time": g.get("commit_time") if committed else None,
            "committed": committed,
            "clean": bool(g.get("clean")),
            "git_state": g.get("state"),
        },
        "check": {
            "refusals_waived": waived,
            "inputs": [i.__dict__ for i in res.inputs],
            "plans": res.plans,
            "label_if_submitted_now": res.label,
            **({"undecidable_accepted": undecidable} if undecidable else {}),
        },
        "remote": {
            "remote": g.get("remote"),
            "branch": g.get("branch"),
            "url": remote_label(g.get("remote_url")),
            "head": g.get("remote_head"),
            "contains": bool(g.get("on_remote")),
            "checked_at": g.get("checked_at"),
            "error": g.get("remote_error"),
        },
        "checkout": {"path": str(root), "head": g.get("head")},
        "arguments": {"argv": list(sys.argv), **opts.to_json(), "engine": engine},
        "budget": budget.to_json(),
        "time_limit": limit.to_json(),
        "cost": cost,
        "comment": comment,
        "job_name": f"agentload-{reg.name}",
        "plans": [{"arm": pl.arm, "rate": pl.rate, "seed": pl.seed, "sha256": pl.sha256} for pl in reg.plans],
        "jobs": [
            {
                "index": s.index,
                "job_id": None,
                "arm": s.arm,
                "rate": s.rate,
                "seed": s.seed,
                "plan_sha256": reg.plan_sha256(s.arm, s.rate, s.seed),
                "run_dir": str(Path(s.run_dir).relative_to(out)),
                "spec": s.to_json(),
            }
            for s in specs
        ],
        "_path": str(out / MANIFEST),
    }
    if opts.executor == "slurm" and opts.dry_run:
        doc["sbatch_script"] = sbatch_script(
            out / JOBS,
            len(specs),
            time_min=limit.minutes,
            warning_lead_s=limit.warning_lead_s,
            checkout=root,
            comment=comment,
            job_name=doc["job_name"],
            job=opts.job,
        )
    return doc


def scheduler_submit_times(ids: list[str], timeout_s: float = 30.0) -> dict[str, str | None]:
    """The scheduler's submit time of each job, as soon as accounting lists them.

    The tasks of one array are one submission with one submit time; accounting lists tasks that
    have not started as one pending range (`5_[1-2]`), so a task takes the submit time of any row
    of its array."""
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, str] = {}
        try:
            for r in accounting(sorted({i.split("_")[0] for i in ids})):
                if r.submit is not None:
                    found[r.job_id] = found.get(r.job_id) or r.submit.isoformat()
                    found.setdefault("array:" + r.job_id.split("_")[0], r.submit.isoformat())
        except SchedulerError:
            pass
        out = {i: found.get(i) or found.get("array:" + i.split("_")[0]) for i in ids}
        if all(out.values()) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def manifest_executor(doc: dict[str, Any], job: JobOptions) -> Any:
    """The SLURM executor of a manifest's jobs: its checkout, time limit, comment and job name, the
    job logs under <testdir>/jobs/. A resubmission (slurm/resubmit.py) takes the same one, so a job
    submitted again asks the scheduler exactly what its first submission asked."""
    tl = doc["time_limit"]
    return slurm_executor(
        Path(doc["_path"]).parent / JOBS,
        time_min=tl["minutes"],
        warning_lead_s=tl["warning_lead_s"],
        checkout=Path(doc["checkout"]["path"]),
        comment=doc["comment"],
        job_name=doc["job_name"],
        job=job,
    )


def submit_registration(
    reg_path: str | Path, opts: SubmitOptions, *, echo: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Check, submit and record (steps 1-5); returns the manifest as written."""
    say = echo or (lambda m: None)
    if opts.executor not in ("slurm", "local"):
        raise SubmitRefused(f"--executor {opts.executor!r}: expected slurm or local")
    doc = plan_submission(reg_path, opts, echo=say)
    if opts.dry_run:
        return doc
    out = Path(doc["_path"]).parent
    specs = [JobSpec.from_json(j["spec"]) for j in doc["jobs"]]
    root = Path(doc["checkout"]["path"])
    folder = out / JOBS
    manifest_path = out / MANIFEST

    def save() -> None:
        write_manifest({k: v for k, v in doc.items() if k != "_path"}, manifest_path)

    if opts.executor == "slurm":
        records = submit_slurm(specs, manifest_executor(doc, opts.job))
        for job, rec in zip(doc["jobs"], records):
            job.update(rec)
        doc["submitted_at_client"] = records[-1]["submitted_at_client"] if records else None
        save()  # the ids are on disk before anything else can fail
        times = scheduler_submit_times([r["job_id"] for r in records])
        for job in doc["jobs"]:
            job["submit_utc"] = times.get(job["job_id"])
        doc["submit_time_source"] = "sacct (the scheduler's accounting, Submit)"
        say(
            f"submitted {len(records)} job(s) as array {records[0]['array_job_id'] or records[0]['job_id']} -> "
            f"{manifest_path}"
            if records
            else "nothing to submit"
        )
    else:
        doc["submit_time_source"] = "local clock (no scheduler: --executor local)"

        def changed(recs: list[dict[str, Any]]) -> None:
            for job, rec in zip(doc["jobs"], recs):
                job.update(rec)
                job["submit_utc"] = rec.get("submitted_at_client")
            save()

        save()
        records = run_local(
            specs,
            folder,
            checkout=root,
            python=opts.job.python,
            env=opts.job.job_env,
            parallel=opts.job.parallel or 1,
            on_change=changed,
            echo=say,
        )
        changed(records)
    lab = label_from_record(doc, [j.get("submit_utc") for j in doc["jobs"]])
    doc["label_at_submission"] = lab.to_json()
    save()
    return doc


def format_plan(doc: dict[str, Any]) -> str:
    """The submission as a person reads it."""
    reg, tl, rem = doc["registration"], doc["time_limit"], doc["remote"]
    lines = [
        f"registration {reg['name']} ({reg['status']}): {reg['path']}",
        f"  sha256   {reg['sha256']}",
        f"  commit   {reg['commit'] or 'not committed'}; tree {'clean' if reg['clean'] else 'DIRTY'}; "
        f"{rem['remote'] or '?'}/{rem['branch'] or '?'} {'contains it' if rem['contains'] else 'does NOT contain it'} "
        f"(asked {rem['checked_at']})",
        f"  engine   {doc['arguments']['engine']}"
        + (f" at time scale {doc['budget']['time_scale']:g}" if doc["budget"]["time_scale"] not in (None, 1.0) else ""),
        f"  limit    {tl['slurm']} per job ({tl['source']}; needs {tl['needed_s']:.0f} s + {tl['warning_lead_s']} s "
        "warning lead" + ("" if tl["fits"] else "; TOO SHORT: the jobs will refuse") + ")",
        f"  jobs     {len(doc['jobs'])} via {doc['executor']}"
        + (" (dry run: nothing submitted)" if doc.get("dry_run") else ""),
    ]
    cost = doc.get("cost")
    if cost and cost["gpus_per_job"]:
        lines.append(
            f"  cost     {cost['jobs']} job(s) x {cost['need_s']:,.0f} s x {cost['gpus_per_job']} GPU = "
            f"{cost['gpu_hours']:,.1f} GPU-hours "
            f"(at most {cost['gpu_hours_limit']:,.1f} at the limit)"
        )
    elif cost:
        lines.append(
            f"  cost     {cost['jobs']} job(s) x {cost['need_s']:,.0f} s, no GPU (engine {doc['arguments']['engine']})"
        )
    for j in doc["jobs"]:
        lines.append(
            f"    {j['index']:>3} {j.get('job_id') or '-':>12}  {j['arm']:<10} x {j['rate']:<6g} seed {j['seed']:<3} "
            f"-> {j['run_dir']}"
        )
    lab = doc.get("label_at_submission") or doc["check"]["label_if_submitted_now"]
    lines.append(f"  label    {lab['label']}: {lab['reason']}")
    if doc.get("sbatch_script"):
        n = len(doc["jobs"])
        what = (
            f"the sbatch script of the job array (task i runs job i above; {n} tasks)"
            if n > 1
            else "the sbatch script of the job"
        )
        lines += ["", f"{what}, as submitit would submit it:", doc["sbatch_script"].rstrip()]
    return "\n".join(lines)
