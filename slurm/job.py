"""The job script: one arm x rate x seed of a registered test, enforced before anything runs.

A registered test's verdict only means something if every run it counts was produced by the code
and the plan the registration fixed, on a fresh engine that passed its checks, in a job that had
time to finish (paper App. E.5, E.7, E.11; rules digest §2.4). The scheduler runs whatever it is
given, so the job itself checks, in this order, and refuses at the first failure:

1. the run directory is free;
2. the registration file exists, has the SHA-256 the submission gave, parses, and is FILLED
   (EXPLORATORY only for an exploratory submission);
3. the arm x rate x seed is one the registration binds;
4. the code that runs is the registration's commit, or a descendant that changes nothing under
   harness/, analysis/, prereg/ or slurm/ but registration data (prereg/registrations, inputs,
   templates: provenance.codepaths.is_code_path) (it runs and says so), with no uncommitted code
   change;
5. the time left in the job (`squeue -h -j $SLURM_JOB_ID -o %L`) covers the protocol's duration
   divided by the time scale plus the registration's start, smoke and teardown allowances, plus the
   lead of the scheduler's warning signal (slurm/budget.py);
6. a GPU cell on a real engine (SGLang, vLLM) was given a GPU: a gpu gres in SLURM, a device the
   host's driver lists otherwise (slurm/gpus.py; every job records what it was given);
7. the plan generated now has the registered SHA-256 (checked by the runner before it drives).

A refusal is an exit status of 3, a `REFUSED: <reason>` line in the job log and a run directory
whose meta.json has status REFUSED and the reason. Otherwise the runner plays the frozen plan on a
fresh engine server (SGLang, vLLM or the emulator, launched with the cell's flags on a free port,
Stage 0 smoke and the flush + canary first, stopped after; runs/realrun.py), and
meta.json binds the run: registration path, SHA-256 and commit, plan SHA-256, code commit, and the
job's scheduler facts (job id, array index, node, partition, time limit) and the time check's
numbers. SIGTERM (scancel, the time limit) and the scheduler's warning signal end the run
INTERRUPTED with its records flushed (exit 5); a job killed outright leaves the append-only records
readable (harness/recording/record.py). A run that fails exits 4.

Entered as `python -m slurm.job --spec SPEC.json` (or the same fields as flags), or through
submitit with a `JobEntry` (slurm/submit.py), whose interpreter runs in the code checkout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from harness.recording.record import RunRecorder
from prereg.registration import RegistrationError, load_registration
from provenance.codepaths import CODE_DIRS, DATA_DIRS, is_code_path
from provenance.git import GitError, Repo
from provenance.meta import capture
from runs.arms import execute_run
from runs.realrun import EngineOptions
from slurm.budget import SCHEDULER_SLACK_S, run_budget
from slurm.gpus import gpu_facts, gpu_refusal
from slurm.scheduler import JobNotFound, SchedulerError, job_facts, time_left_s

EXIT_COMPLETED = 0
EXIT_REFUSED = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 5
EXIT_CODES = {
    "COMPLETED": EXIT_COMPLETED,
    "REFUSED": EXIT_REFUSED,
    "FAILED": EXIT_FAILED,
    "INTERRUPTED": EXIT_INTERRUPTED,
}

#: The scheduler's warning before the time limit (sbatch --signal=URG@lead; slurm/submit.py).
#: SIGURG is ignored by default, so the engine server, which gets every signal the job's processes
#: get, is not killed by it; only this process acts on it.
WARNING_SIGNAL = signal.SIGURG

#: The checkout whose code this process runs: the folder above slurm/.
CODE_ROOT = Path(__file__).resolve().parent.parent

ENGINE_OPTION_KEYS = (
    "server_cmd",
    "model",
    "served_model_name",
    "extra_args",
    "health_timeout",
    "request_timeout",
    "flavor",
)


@dataclass(frozen=True)
class JobSpec:
    """Everything a job is told. `registration` is relative to the code checkout (or absolute)."""

    registration: str
    sha256: str
    arm: str
    rate: float
    seed: int
    run_dir: str
    engine: str = "emulator"
    time_scale: float | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    commit: str | None = None  # the registration's commit as the submission resolved it
    exploratory: bool = False
    warning_lead_s: float = 0.0
    index: int | None = None  # position in the submission

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        unknown = sorted(set(data) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise ValueError(f"job spec: unknown field(s) {unknown}")
        return cls(**data)


@dataclass
class JobOutcome:
    status: str  # COMPLETED | REFUSED | FAILED | INTERRUPTED
    reason: str | None
    run_dir: str
    check: str | None = None  # which check refused
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}


class Refused(Exception):
    """A check failed: nothing may run. `check` names it (registration-missing, code, time, ...)."""

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check
        self.reason = reason


class Stopped(KeyboardInterrupt):
    """SIGTERM/SIGINT (or the scheduler's warning) outside the engine driver's own handling."""


def _utc() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _say(msg: str) -> None:
    print(f"agentload job: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# scheduler facts
# ---------------------------------------------------------------------------------------------
def scheduler_facts() -> dict[str, Any]:
    """The job as SLURM describes it (empty ids outside SLURM). Time left and limit come from the
    controller (`squeue %L`/`%l`), the rest from the job's environment."""
    env = os.environ
    jid = env.get("SLURM_JOB_ID")
    facts: dict[str, Any] = {
        "in_slurm": bool(jid),
        "job_id": jid,
        "array_job_id": env.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": int(env["SLURM_ARRAY_TASK_ID"]) if env.get("SLURM_ARRAY_TASK_ID", "").isdigit() else None,
        "node": env.get("SLURMD_NODENAME") or env.get("SLURM_JOB_NODELIST"),
        "partition": env.get("SLURM_JOB_PARTITION"),
        "cluster": env.get("SLURM_CLUSTER_NAME"),
        "time_limit_s": None,
        "time_limit": None,
        "time_left_s": None,
        "time_left": None,
        "error": None,
    }
    if facts["array_job_id"] and facts["array_task_id"] is not None:
        facts["job_label"] = f"{facts['array_job_id']}_{facts['array_task_id']}"
    else:
        facts["job_label"] = jid
    if not jid:
        return facts

    try:
        # An array task is asked for by ARRAY_TASK: the last task of an array runs under the
        # array's own id, for which squeue lists every task of the array.
        try:
            jf = job_facts(facts["job_label"] or jid)
        except JobNotFound:
            if facts["job_label"] == jid:
                raise
            jf = job_facts(jid)
        facts.update(
            time_limit_s=_finite(jf.time_limit_s),
            time_limit=jf.time_limit,
            time_left_s=_finite(jf.time_left_s),
            time_left=jf.time_left,
            partition=facts["partition"] or jf.partition,
            node=facts["node"] or jf.nodes,
        )
        facts["unlimited"] = jf.time_left_s is not None and math.isinf(jf.time_left_s)
    except SchedulerError as exc:
        facts["error"] = str(exc).splitlines()[0]
    return facts


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else float(x)


def time_check(facts: dict[str, Any], budget: Any, lead_s: float) -> dict[str, Any]:
    """The pre-run time check's numbers; `ok` False means refuse."""
    need = budget.needed_s
    out = {
        **budget.to_json(),
        "warning_lead_s": float(lead_s),
        "required_s": need + float(lead_s),
        "time_left_s": facts.get("time_left_s"),
        "time_left": facts.get("time_left"),
        "checked_at": _utc(),
    }
    if not facts.get("in_slurm"):
        return {**out, "source": "none: not in a SLURM job (no time limit to check)", "ok": True}
    out["source"] = "squeue -h -j $SLURM_JOB_ID -o %L"
    if facts.get("error"):
        return {**out, "ok": False, "problem": f"the time left could not be read: {facts['error']}"}
    if facts.get("unlimited"):
        return {**out, "ok": True, "note": "the job has no time limit"}
    left = facts.get("time_left_s")
    if left is None:
        return {**out, "ok": False, "problem": f"the scheduler reports no time limit yet ({facts.get('time_left')!r})"}
    return {**out, "ok": left >= need + lead_s}


# ---------------------------------------------------------------------------------------------
# the code check
# ---------------------------------------------------------------------------------------------
def code_check(code_root: Path, reg_path: Path, expected_commit: str | None, exploratory: bool) -> dict[str, Any]:
    """Is the code that runs the registration's? Returns the facts; raises Refused when it is not
    (in an exploratory job the facts are recorded and nothing is refused)."""

    def refuse(reason: str, facts: dict[str, Any]) -> dict[str, Any]:
        if exploratory:
            return {**facts, "relation": "exploratory", "problem": reason}
        raise Refused("code", reason)

    facts: dict[str, Any] = {"checkout": str(code_root), "code_dirs": list(CODE_DIRS), "data_dirs": list(DATA_DIRS)}
    try:
        repo = Repo.containing(code_root)
        head = repo.head()
    except GitError as exc:
        return refuse(f"the code checkout {code_root} is not a git working tree ({exc})", facts)
    facts["head"] = head
    try:
        rel = repo.relpath(reg_path)
    except ValueError:
        return refuse(
            f"the registration {reg_path} is not inside the code checkout {repo.path}; jobs run the code of the registration's repository",
            facts,
        )
    state = repo.file_state(rel)
    facts["registration_state"] = state
    if state != "committed":
        what = "is not committed" if state == "untracked" else "differs from its last commit"
        return refuse(f"the registration {rel} {what} in the checkout {repo.path}", facts)
    reg_commit = repo.last_commit_of(rel)
    facts["registration_commit"] = reg_commit
    if expected_commit and reg_commit != expected_commit:
        return refuse(
            f"the registration's commit in this checkout is {reg_commit}, but the submission resolved {expected_commit}",
            facts,
        )
    dirty = [
        ln
        for ln in repo.git("diff", "--name-only", "HEAD", "--", *[d.rstrip("/") for d in CODE_DIRS]).splitlines()
        if is_code_path(ln)
    ]
    if dirty:
        facts["uncommitted"] = dirty[:20]
        return refuse(f"the checkout has uncommitted code changes: {dirty[:5]}", facts)
    if head == reg_commit:
        return {**facts, "relation": "same", "note": f"runs the registration's commit {reg_commit[:12]}"}
    if not repo.is_ancestor(reg_commit, head):
        return refuse(
            f"the checkout's commit {head[:12]} does not descend from the registration's commit {reg_commit[:12]}",
            facts,
        )
    changed = repo.changed_paths(reg_commit, head)
    code = [p for p in changed if is_code_path(p)]
    facts["changed_paths"] = changed[:50]
    if code:
        return refuse(
            f"the code differs from the registration's commit {reg_commit[:12]}: commit {head[:12]} changes {code[:5]}",
            facts,
        )
    return {
        **facts,
        "relation": "descendant without code changes",
        "note": f"runs commit {head[:12]}, a descendant of the registration's commit {reg_commit[:12]} that changes no code "
        f"({len(changed)} other path(s) changed)",
    }


# ---------------------------------------------------------------------------------------------
# signals
# ---------------------------------------------------------------------------------------------
class _Signals:
    """SIGTERM/SIGINT raise Stopped (the engine driver installs its own while it drives); the
    warning signal is recorded and turned into a SIGTERM to this process alone."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self._old: dict[int, Any] = {}

    def _stop(self, signum: int, _frame: Any) -> None:
        self.received.append({"signal": signal.Signals(signum).name, "at": _utc()})
        raise Stopped(f"signal {signal.Signals(signum).name}")

    def _warn(self, signum: int, _frame: Any) -> None:
        self.received.append(
            {"signal": signal.Signals(signum).name, "at": _utc(), "meaning": "the scheduler's warning: time limit near"}
        )
        _say(f"{signal.Signals(signum).name}: the scheduler warns that the time limit is near; ending the run")
        os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self) -> _Signals:
        try:
            for s, h in ((signal.SIGTERM, self._stop), (signal.SIGINT, self._stop), (WARNING_SIGNAL, self._warn)):
                self._old[s] = signal.signal(s, h)
        except ValueError:  # not the main thread: signals stay as they are
            pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    @property
    def warned(self) -> bool:
        return any(r.get("meaning") for r in self.received)


# ---------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------
def _refused_run(run_dir: Path, meta: dict[str, Any], refusal: Refused) -> None:
    meta = {
        **meta,
        "refusal": {"check": refusal.check, "reason": refusal.reason},
        "provenance": capture(include_gpu=False),
    }
    rec = RunRecorder(run_dir, meta)
    rec.close("REFUSED", refusal.reason)


def _patch_meta(run_dir: Path, update: Callable[[dict[str, Any]], None]) -> None:
    path = run_dir / "meta.json"
    meta = orjson.loads(path.read_bytes())
    update(meta)
    tmp = path.with_name(f".meta.json.tmp{os.getpid()}")
    tmp.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
    os.replace(tmp, path)


def _engine_options(spec: JobSpec) -> dict[str, Any] | None:
    if spec.engine == "sim":
        return None

    unknown = sorted(set(spec.engine_options) - set(ENGINE_OPTION_KEYS))
    if unknown:
        raise Refused(
            "arguments", f"engine options {unknown} are not known; expected some of {list(ENGINE_OPTION_KEYS)}"
        )
    opts = asdict(EngineOptions(engine=spec.engine, time_scale=float(spec.time_scale or 1.0)))
    opts.update(
        {
            k: (tuple(v) if k in ("server_cmd", "extra_args") and v is not None else v)
            for k, v in spec.engine_options.items()
        }
    )
    opts.update(
        smoke=True, canary=True, progress=True, progress_every=30.0
    )  # registered runs always check the engine first
    return opts


def run_job(spec: JobSpec, *, code_root: Path | None = None) -> JobOutcome:
    """Check, then run (or refuse) one job; never raises for what a check or the run finds."""
    root = (code_root or CODE_ROOT).resolve()
    run_dir = Path(spec.run_dir)
    facts = scheduler_facts()
    job_meta: dict[str, Any] = {
        **facts,
        "started_at": _utc(),
        "executor": "slurm" if facts["in_slurm"] else "local",
        "spec": spec.to_json(),
        "pid": os.getpid(),
        "code_root": str(root),
        "gpus": gpu_facts(facts),
    }
    meta: dict[str, Any] = {
        "job": job_meta,
        "arm": spec.arm,
        "rate": float(spec.rate),
        "seed": int(spec.seed),
        "engine_backend": spec.engine,
        "registration": {"path": spec.registration, "sha256": None, "expected_sha256": spec.sha256, "commit": None},
    }
    _say(
        f"{spec.arm} x {spec.rate:g} seed {spec.seed} under {spec.registration} (sha256 {spec.sha256[:12]}...), "
        f"engine {spec.engine}, job {facts.get('job_label') or '(no scheduler)'} on {facts.get('node') or os.uname().nodename}"
    )
    if (run_dir / "meta.json").exists():
        reason = f"{run_dir} already holds a run; a job never overwrites one"
        _say(f"REFUSED: {reason}")
        return JobOutcome("REFUSED", reason, str(run_dir), "run-dir")
    with _Signals() as sig:
        try:
            return _checked_run(spec, root, run_dir, meta, sig)
        except Refused as r:
            _refused_run(run_dir, meta, r)
            _say(f"REFUSED ({r.check}): {r.reason}")
            return JobOutcome("REFUSED", r.reason, str(run_dir), r.check)
        except Stopped as exc:
            reason = f"interrupted: {exc}"
            if not (run_dir / "meta.json").exists():
                RunRecorder(run_dir, meta).close("INTERRUPTED", reason)
            else:
                _annotate(run_dir, sig, "INTERRUPTED", reason)
            _say(f"INTERRUPTED: {reason} ({run_dir})")
            return JobOutcome("INTERRUPTED", reason, str(run_dir))


def _checked_run(spec: JobSpec, root: Path, run_dir: Path, meta: dict[str, Any], sig: _Signals) -> JobOutcome:
    reg_path = Path(spec.registration)
    reg_path = reg_path if reg_path.is_absolute() else root / reg_path
    if not reg_path.is_file():
        raise Refused("registration-missing", f"registration {spec.registration} is missing: no file {reg_path}")
    try:
        reg = load_registration(reg_path, expect_sha256=spec.sha256)
    except RegistrationError as exc:
        text = str(exc)
        check = "registration-hash" if "SHA-256 is" in text and "expected" in text else "registration-invalid"
        raise Refused(check, text) from None
    meta["test"] = reg.test
    meta["registration"] = {**meta["registration"], "name": reg.name, "sha256": reg.sha256, "status": reg.status}
    allowed = ("FILLED", "EXPLORATORY") if spec.exploratory else ("FILLED",)
    if reg.status not in allowed:
        why = f" ({'; '.join(reg.status_reasons)})" if reg.status_reasons else ""
        extra = (
            ""
            if spec.exploratory or reg.status != "EXPLORATORY"
            else " (an EXPLORATORY one only in an exploratory submission)"
        )
        raise Refused(
            "registration-status",
            f"registration {reg.name} is {reg.status}{why}; a job runs only under a FILLED registration{extra}",
        )
    want_plan = reg.plan_sha256(spec.arm, float(spec.rate), int(spec.seed))
    if want_plan is None:
        raise Refused(
            "not-registered",
            f"{spec.arm} x {spec.rate:g} seed {spec.seed} is not an arm x rate x seed that {reg.name} registers "
            f"(arms {reg.arms}, rates {reg.multiples()}, seeds {reg.seeds})",
        )
    code = code_check(root, reg_path, spec.commit, spec.exploratory)
    meta["code"] = code
    try:
        rel = Path(reg_path).resolve().relative_to(root).as_posix()
    except ValueError:
        rel = str(reg_path)
    meta["registration"] = {
        **reg.binding(rel, code.get("registration_commit")),
        "status": reg.status,
        "expected_sha256": spec.sha256,
    }
    if code.get("note"):
        _say(code["note"])
    if code.get("problem"):
        _say(f"exploratory: {code['problem']}")
    try:
        budget = run_budget(reg.protocol.duration, reg.allowances, spec.engine, spec.time_scale)
    except ValueError as exc:
        raise Refused("arguments", str(exc)) from None
    tc = time_check(meta["job"], budget, spec.warning_lead_s)
    meta["time_check"] = tc
    _say(
        f"time check: need {tc['needed_s']:.0f} s (run {tc['run_s']:.0f} + start {tc['start_s']:.0f} + smoke {tc['smoke_s']:.0f} "
        f"+ teardown {tc['teardown_s']:.0f}) + warning lead {tc['warning_lead_s']:.0f}; left {tc['time_left_s']} s ({tc['source']})"
    )
    if not tc["ok"]:
        if tc.get("problem"):
            raise Refused("time", f"the time check cannot be made: {tc['problem']}")
        why = (
            f"{tc['time_left_s']:.0f} s left in the job, {tc['required_s']:.0f} s needed "
            f"({tc['needed_s']:.0f} s for the run and its allowances + {tc['warning_lead_s']:.0f} s warning lead)"
        )
        raise Refused("time", f"too little time: {why}; resubmit with a longer --time")
    no_gpu = gpu_refusal(reg.cell, spec.engine, meta["job"]["gpus"])
    if no_gpu:
        raise Refused("gpu", no_gpu)
    options = _engine_options(spec)
    meta["engine_options"] = options
    bundle = reg.bundle()
    res = execute_run(
        bundle,
        spec.arm,
        float(spec.rate),
        int(spec.seed),
        spec.engine,
        run_dir,
        options=options,
        expect_plan_sha256=want_plan,
        extra_meta=meta,
    )
    status = res.status
    reason = res.reason
    if status == "REFUSED":
        _say(f"REFUSED (plan): {reason}")
        _annotate(run_dir, sig, status, refusal={"check": "plan", "reason": reason})
        return JobOutcome("REFUSED", reason, str(run_dir), "plan")
    if sig.warned and status == "INTERRUPTED":
        reason = f"{reason} (after the scheduler's time-limit warning)"
    _annotate(run_dir, sig, status, reason if sig.warned else None)
    if sig.warned and status == "INTERRUPTED" and meta["job"].get("in_slurm"):
        _await_limit(run_dir, sig, meta["job"])
    _say(f"{status}: {reason or 'the run completed'} ({res.wall_s:.1f} s; {run_dir})")
    notes = [code["note"]] if code.get("note") else []
    if status not in EXIT_CODES:
        status = "FAILED"
    return JobOutcome(status, reason, str(run_dir), None, notes)


def _await_limit(run_dir: Path, sig: _Signals, job: dict[str, Any]) -> None:
    """After the time-limit warning ended the run (its records flushed, the engine stopped), wait
    for the limit itself, so the scheduler ends the job and its accounting says TIMEOUT: the job
    did run out of time, and a job that exited on its own would read FAILED (exit 5) there, which
    names no cause. Waits at most the time left plus the scheduler's slack; any signal ends the wait."""
    try:
        left = time_left_s(job.get("job_label") or job.get("job_id"))
    except SchedulerError:
        left = None
    wait = (left if left is not None and math.isfinite(left) else 0.0) + 2 * SCHEDULER_SLACK_S
    _say(
        f"the run ended INTERRUPTED at the time-limit warning; waiting up to {wait:.0f} s for the limit, so accounting records TIMEOUT"
    )
    t0 = time.monotonic()
    outcome = "the wait ended without a signal"
    try:
        while time.monotonic() - t0 < wait:
            time.sleep(1.0)
    except Stopped as exc:
        outcome = f"ended by {exc} (the scheduler's limit)"
    except KeyboardInterrupt:
        outcome = "ended by an interrupt"

    def upd(m: dict[str, Any]) -> None:
        m.setdefault("job", {})["limit_wait"] = {"waited_s": round(time.monotonic() - t0, 3), "max_s": round(wait, 3),
                                                  "time_left_s": left, "outcome": outcome, "ended_at": _utc()}  # fmt: skip
        m["job"]["signals"] = list(sig.received)

    _patch_meta(run_dir, upd)


def _annotate(
    run_dir: Path, sig: _Signals, status: str, reason: str | None = None, refusal: dict[str, Any] | None = None
) -> None:
    def upd(m: dict[str, Any]) -> None:
        if refusal is not None:
            m["refusal"] = refusal
        m.setdefault("job", {})
        m["job"]["signals"] = list(sig.received)
        m["job"]["ended_at"] = _utc()
        m["job"]["outcome"] = status
        if reason is not None:
            m["status_reason"] = reason

    _patch_meta(run_dir, upd)


# ---------------------------------------------------------------------------------------------
# entries
# ---------------------------------------------------------------------------------------------
class JobEntry:
    """The callable submitit pickles (by reference: the job imports slurm.job from its checkout).

    A completed run returns its outcome; any other outcome exits with its status (3 refused, 4
    failed, 5 interrupted), which the scheduler's accounting records as the job's exit code."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = dict(spec)

    def __call__(self) -> dict[str, Any]:
        outcome = run_job(JobSpec.from_json(self.spec))
        sys.stdout.flush()
        sys.stderr.flush()
        if outcome.exit_code:
            raise SystemExit(outcome.exit_code)
        return outcome.to_json()

    def __repr__(self) -> str:
        s = self.spec
        return f"JobEntry({s.get('arm')} x {s.get('rate')} seed {s.get('seed')})"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slurm.job", description="Run one registered arm x rate x seed (or refuse to)."
    )
    p.add_argument("--spec", help="JSON file with the job spec (the fields below)")
    p.add_argument("--registration")
    p.add_argument("--sha256")
    p.add_argument("--arm")
    p.add_argument("--rate", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--run-dir")
    p.add_argument("--engine", default="emulator")
    p.add_argument("--time-scale", type=float)
    p.add_argument("--commit")
    p.add_argument("--exploratory", action="store_true")
    p.add_argument("--warning-lead-s", type=float, default=0.0)
    p.add_argument("--engine-options", help="JSON object of engine options (server_cmd, model, extra_args, ...)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.spec:
        spec = JobSpec.from_json(json.loads(Path(args.spec).read_text()))
    else:
        missing = [n for n in ("registration", "sha256", "arm", "rate", "seed", "run_dir") if getattr(args, n) is None]
        if missing:
            _say(f"REFUSED: missing arguments {['--' + m.replace('_', '-') for m in missing]} (or give --spec)")
            return EXIT_REFUSED
        spec = JobSpec(
            args.registration,
            args.sha256,
            args.arm,
            args.rate,
            args.seed,
            args.run_dir,
            args.engine,
            args.time_scale,
            json.loads(args.engine_options) if args.engine_options else {},
            args.commit,
            args.exploratory,
            args.warning_lead_s,
        )
    return run_job(spec).exit_code


if __name__ == "__main__":
    sys.exit(main())
