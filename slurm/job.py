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
from pathlib import Path
from typing import Any

import orjson

from harness.atomic import write_bytes_atomic
from harness.errors import ConfigError
from harness.recording.record import RunRecorder
from harness.recording.schema import RunStatus
from prereg.registration import RegistrationError, load_registration
from provenance.meta import capture
from runs.arms import execute_run
from runs.realrun import EngineOptions
from slurm.budget import SCHEDULER_SLACK_S, run_budget
from slurm.checks import CodeCheck, Refused, SchedulerFacts, TimeCheck, code_check, scheduler_facts, time_check
from slurm.checks import utc_now as _utc
from slurm.exits import JobExit
from slurm.gpus import gpu_facts, gpu_refusal
from slurm.scheduler import SchedulerError, time_left_s

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
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"job spec: unknown field(s) {unknown}; expected some of {list(cls.__dataclass_fields__)}"
            )
        return cls(**data)


@dataclass
class JobOutcome:
    status: RunStatus  # COMPLETED | REFUSED | FAILED | INTERRUPTED
    reason: str | None
    run_dir: str
    check: str | None = None  # which check refused
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> JobExit:
        return JobExit.of(self.status)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status), "exit_code": int(self.exit_code)}


# ---------------------------------------------------------------------------------------------
# what the job writes into its run's meta.json
# ---------------------------------------------------------------------------------------------
@dataclass
class JobBinding:
    """The run's `registration` block: what the submission named, then what the checks found (the
    registration's binding, its status and the hash the submission expected)."""

    path: str | None
    expected_sha256: str
    sha256: str | None = None
    commit: str | None = None
    name: str | None = None
    status: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None or k not in ("name", "status")}


@dataclass
class JobRecord:
    """The run's `job` block: the scheduler's facts and how this process was started."""

    facts: SchedulerFacts
    started_at: str
    spec: JobSpec
    pid: int
    code_root: str
    gpus: dict[str, Any] = field(default_factory=dict)  # what GPUs the job was given (slurm/gpus.py)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.facts.to_json(),
            "started_at": self.started_at,
            "executor": "slurm" if self.facts.in_slurm else "local",
            "spec": self.spec.to_json(),
            "pid": self.pid,
            "code_root": self.code_root,
            "gpus": self.gpus,
        }


class _Unset:
    """A block the checks have not reached yet (absent from meta.json, unlike a None value)."""


UNSET = _Unset()


@dataclass
class JobRunMeta:
    """What a job adds to its run's meta.json, filled in as its checks pass (execute_run merges it)."""

    job: JobRecord
    arm: str
    rate: float
    seed: int
    engine_backend: str
    registration: JobBinding
    test: str | None = None
    code: CodeCheck | None = None
    time_check: TimeCheck | None = None
    engine_options: dict[str, Any] | _Unset | None = UNSET

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job.to_json(),
            "arm": self.arm,
            "rate": self.rate,
            "seed": self.seed,
            "engine_backend": self.engine_backend,
            "registration": self.registration.to_json(),
        }
        if self.test is not None:
            out["test"] = self.test
        if self.code is not None:
            out["code"] = self.code.to_json()
        if self.time_check is not None:
            out["time_check"] = self.time_check.to_json()
        if not isinstance(self.engine_options, _Unset):
            out["engine_options"] = self.engine_options
        return out


@dataclass(frozen=True)
class JobEnd:
    """What a job patches into meta.json once its run has ended: the signals it got, when it ended,
    how (`job.outcome`), and a reason or refusal the run itself could not know."""

    signals: list[dict[str, Any]]
    outcome: RunStatus
    ended_at: str = field(default_factory=_utc)
    status_reason: str | None = None
    refusal: dict[str, Any] | None = None

    def apply(self, meta: dict[str, Any]) -> None:
        if self.refusal is not None:
            meta["refusal"] = self.refusal
        job = meta.setdefault("job", {})
        job["signals"] = list(self.signals)
        job["ended_at"] = self.ended_at
        job["outcome"] = str(self.outcome)
        if self.status_reason is not None:
            meta["status_reason"] = self.status_reason


class Stopped(KeyboardInterrupt):
    """SIGTERM/SIGINT (or the scheduler's warning) outside the engine driver's own handling."""


def _say(msg: str) -> None:
    print(f"agentload job: {msg}", file=sys.stderr, flush=True)


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
def _refused_run(run_dir: Path, meta: JobRunMeta, refusal: Refused) -> None:
    record = {
        **meta.to_json(),
        "refusal": {"check": refusal.check, "reason": refusal.reason},
        "provenance": capture(include_gpu=False),
    }
    rec = RunRecorder(run_dir, record)
    rec.close(RunStatus.REFUSED, refusal.reason)


def _patch_meta(run_dir: Path, update: Callable[[dict[str, Any]], None]) -> None:
    path = run_dir / "meta.json"
    meta = orjson.loads(path.read_bytes())
    update(meta)
    opts = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    write_bytes_atomic(path, orjson.dumps(meta, option=opts))


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
    meta = JobRunMeta(
        job=JobRecord(facts, _utc(), spec, os.getpid(), str(root), gpu_facts(facts.to_json())),
        arm=spec.arm,
        rate=float(spec.rate),
        seed=int(spec.seed),
        engine_backend=spec.engine,
        registration=JobBinding(path=spec.registration, expected_sha256=spec.sha256),
    )
    _say(
        f"{spec.arm} x {spec.rate:g} seed {spec.seed} under {spec.registration} (sha256 {spec.sha256[:12]}...), "
        f"engine {spec.engine}, job {facts.job_label or '(no scheduler)'} on {facts.node or os.uname().nodename}"
    )
    if (run_dir / "meta.json").exists():
        reason = f"{run_dir} already holds a run; a job never overwrites one"
        _say(f"REFUSED: {reason}")
        return JobOutcome(RunStatus.REFUSED, reason, str(run_dir), "run-dir")
    with _Signals() as sig:
        try:
            return _checked_run(spec, root, run_dir, meta, sig)
        except Refused as r:
            _refused_run(run_dir, meta, r)
            _say(f"REFUSED ({r.check}): {r.reason}")
            return JobOutcome(RunStatus.REFUSED, r.reason, str(run_dir), r.check)
        except Stopped as exc:
            reason = f"interrupted: {exc}"
            if not (run_dir / "meta.json").exists():
                RunRecorder(run_dir, meta.to_json()).close(RunStatus.INTERRUPTED, reason)
            else:
                _annotate(run_dir, sig, RunStatus.INTERRUPTED, reason)
            _say(f"INTERRUPTED: {reason} ({run_dir})")
            return JobOutcome(RunStatus.INTERRUPTED, reason, str(run_dir))


def _checked_run(spec: JobSpec, root: Path, run_dir: Path, meta: JobRunMeta, sig: _Signals) -> JobOutcome:
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
    meta.test = reg.test
    meta.registration.name, meta.registration.sha256, meta.registration.status = reg.name, reg.sha256, reg.status
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
    meta.code = code
    try:
        rel = Path(reg_path).resolve().relative_to(root).as_posix()
    except ValueError:
        rel = str(reg_path)
    meta.registration = JobBinding(
        **reg.binding(rel, code.registration_commit), status=reg.status, expected_sha256=spec.sha256
    )
    if code.note:
        _say(code.note)
    if code.problem:
        _say(f"exploratory: {code.problem}")
    try:
        budget = run_budget(reg.protocol.duration, reg.allowances, spec.engine, spec.time_scale)
    except ValueError as exc:
        raise Refused("arguments", str(exc)) from None
    tc = time_check(meta.job.facts, budget, spec.warning_lead_s)
    meta.time_check = tc
    b = tc.budget
    _say(
        f"time check: need {tc.needed_s:.0f} s (run {b.run_s:.0f} + start {b.start_s:.0f} + smoke {b.smoke_s:.0f} "
        f"+ teardown {b.teardown_s:.0f}) + warning lead {tc.warning_lead_s:.0f}; left {tc.time_left_s} s ({tc.source})"
    )
    if not tc.ok:
        if tc.problem:
            raise Refused("time", f"the time check cannot be made: {tc.problem}")
        why = (
            f"{tc.time_left_s:.0f} s left in the job, {tc.required_s:.0f} s needed "
            f"({tc.needed_s:.0f} s for the run and its allowances + {tc.warning_lead_s:.0f} s warning lead)"
        )
        raise Refused("time", f"too little time: {why}; resubmit with a longer --time")
    no_gpu = gpu_refusal(reg.cell, spec.engine, meta.job.gpus)
    if no_gpu:
        raise Refused("gpu", no_gpu)
    options = _engine_options(spec)
    meta.engine_options = options
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
        extra_meta=meta.to_json(),
    )
    status = RunStatus(res.status)
    reason = res.reason
    if status == RunStatus.REFUSED:
        _say(f"REFUSED (plan): {reason}")
        _annotate(run_dir, sig, status, refusal={"check": "plan", "reason": reason})
        return JobOutcome(RunStatus.REFUSED, reason, str(run_dir), "plan")
    if sig.warned and status == RunStatus.INTERRUPTED:
        reason = f"{reason} (after the scheduler's time-limit warning)"
    _annotate(run_dir, sig, status, reason if sig.warned else None)
    if sig.warned and status == RunStatus.INTERRUPTED and meta.job.facts.in_slurm:
        _await_limit(run_dir, sig, meta.job.facts)
    _say(f"{status}: {reason or 'the run completed'} ({res.wall_s:.1f} s; {run_dir})")
    notes = [code.note] if code.note else []
    if status == RunStatus.RUNNING:  # a run the runner left open did not end as a job may end
        status = RunStatus.FAILED
    return JobOutcome(status, reason, str(run_dir), None, notes)


def _await_limit(run_dir: Path, sig: _Signals, facts: SchedulerFacts) -> None:
    """After the time-limit warning ended the run (its records flushed, the engine stopped), wait
    for the limit itself, so the scheduler ends the job and its accounting says TIMEOUT: the job
    did run out of time, and a job that exited on its own would read FAILED (exit 5) there, which
    names no cause. Waits at most the time left plus the scheduler's slack; any signal ends the wait."""
    try:
        left = time_left_s(facts.job_label or facts.job_id)
    except SchedulerError:
        left = None
    wait = (left if left is not None and math.isfinite(left) else 0.0) + 2 * SCHEDULER_SLACK_S
    _say(
        f"the run ended INTERRUPTED at the time-limit warning; waiting up to {wait:.0f} s for the limit, "
        "so accounting records TIMEOUT"
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
        m.setdefault("job", {})["limit_wait"] = {
            "waited_s": round(time.monotonic() - t0, 3),
            "max_s": round(wait, 3),
            "time_left_s": left,
            "outcome": outcome,
            "ended_at": _utc(),
        }
        m["job"]["signals"] = list(sig.received)

    _patch_meta(run_dir, upd)


def _annotate(
    run_dir: Path, sig: _Signals, status: RunStatus, reason: str | None = None, refusal: dict[str, Any] | None = None
) -> None:
    _patch_meta(run_dir, JobEnd(list(sig.received), status, status_reason=reason, refusal=refusal).apply)


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
            return JobExit.REFUSED
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
