"""From a test config to run directories: plan, freeze, drive, record; one run or a whole test.

One run = (test, arm, rate, seed, engine). Its plan is generated from the configs, frozen to the
run directory and hashed before anything is driven; the client plays the plan it finds on disk
(read back, not the in-memory copy), so what was hashed is what was played. The engine is a
pluggable backend: 'sim' (the reference engine model in virtual time) is built in, and the
real-engine and emulator backends register themselves with `register_backend`, so the same
runner, recorder and analysis serve every engine.

A test runs every arm x rate x seed in parallel worker processes (longest runs first, since the
trapped BURST arms are the slow ones) and reports progress from each worker to one display.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.openloop import open_loop_summary, warning_text
from analysis.rules import arm_expectation, arm_expectations, load_rule
from harness.client.contract import Command, TurnResponse
from harness.client.openloop import PlanClient, arm_client
from harness.config import ArmConfig, TestBundle
from harness.drivers.virtual import simulate
from harness.errors import ConfigError, RuleError
from harness.recording.record import RunRecorder
from harness.recording.schema import HIT_THRESHOLD, RunStatus, is_hit
from harness.refengine.model import EngineModel
from harness.workload.planfile import read_plan, write_plan
from harness.workload.plans import make_plan
from provenance.meta import capture
from runs import realrun  # noqa: F401 - registers the real-engine and emulator backends
from runs.backend import BackendResult, RunContext, get_backend, register_backend
from runs.meta import PlanCheck, PlanRecord, RunMeta

log = logging.getLogger("agentload.runner")

PLAN_FILE = "plan.parquet"


# ---------------------------------------------------------------------------------------------
# the built-in backend: the engine model in virtual time (runs.realrun registers the real engines)
# ---------------------------------------------------------------------------------------------
def _sim_backend(ctx: RunContext) -> BackendResult:
    client = ctx.observer.wrap(ctx.client) if ctx.observer else ctx.client
    engine = EngineModel(ctx.bundle.cell, seed=ctx.seed)
    res = simulate(
        client, engine, recorder=ctx.recorder, until=ctx.duration, gauge_interval=ctx.bundle.protocol.gauge_interval
    )
    meta = {
        "engine": {"backend": "sim", "model": "harness.refengine.model.EngineModel (virtual time)"},
        "simulation": res.as_meta(),
    }
    return BackendResult(RunStatus.COMPLETED, None, float(res.end_time), meta)


register_backend("sim", _sim_backend)


# ---------------------------------------------------------------------------------------------
# progress from inside a run
# ---------------------------------------------------------------------------------------------
class Observer:
    """Wraps a client to report plan time, backlog and recent hits every `every` plan seconds.

    The driver never knows: it drives the wrapper like the client. `post` receives a dict.
    """

    def __init__(self, key: str, post: Callable[[dict[str, Any]], None], every: float = 50.0) -> None:
        self.key = key
        self.post = post
        self.every = every
        self._next = 0.0
        self._n = 0
        self._hits = 0

    def wrap(self, client: PlanClient) -> _Observed:
        return _Observed(client, self)

    def see(self, now: float, client: PlanClient) -> None:
        if now >= self._next:
            self._next = (math.floor(now / self.every) + 1) * self.every
            hf = self._hits / self._n if self._n else None
            self._n = self._hits = 0
            self.post(
                {
                    "key": self.key,
                    "t": now,
                    "in_system": client.in_system,
                    "in_flight": client.in_flight,
                    "held": client.held,
                    "hit": hf,
                }
            )


class _Observed:
    def __init__(self, client: PlanClient, obs: Observer) -> None:
        self._c = client
        self._o = obs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)

    def start(self, now: float) -> Sequence[Command]:
        return self._c.start(now)

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        out = self._c.on_timer(now, key)
        self._o.see(now, self._c)
        return out

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        if response.status == "ok" and response.prompt_tokens:
            self._o._n += 1
            self._o._hits += is_hit(response.cached_tokens, response.prompt_tokens, HIT_THRESHOLD)
        out = self._c.on_response(now, response)
        self._o.see(now, self._c)
        return out

    def finished(self) -> bool:
        return self._c.finished()


# ---------------------------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------------------------
def find_arm(bundle: TestBundle, name: str) -> tuple[str, ArmConfig]:
    """An arm of the test by its name, or the reference the test gave for it, case-insensitively."""
    refs = bundle.arm_refs or {}
    for key, arm in bundle.arms.items():
        if name.lower() in (key.lower(), arm.name.lower(), refs.get(key, key).lower()):
            return key, arm
    raise ConfigError(f"arm {name!r} is not in test {bundle.test.name!r}; its arms are {list(bundle.arms)}")


def run_name(arm: str, rate: float, seed: int) -> str:
    return f"{arm.lower()}-r{rate:.2f}-s{seed}"


@dataclass
class RunResult:
    run_dir: str
    arm: str
    rate: float
    seed: int
    status: RunStatus
    reason: str | None
    wall_s: float
    plan_time: float
    detail: str | None = None  # the traceback of a run that raised (shown with --debug only)
    open_loop: dict[str, Any] | None = None  # start-lateness summary, as in meta.json
    warnings: list[str] = field(default_factory=list)
    shared_from: str | None = None  # the run whose simulation this one shares (runs/shared_sims.py)


def references(bundle: TestBundle) -> dict[str, float]:
    """The registered reference inputs of the cell (the paper's E0a values unless re-measured)."""
    cell = bundle.cell
    own = bundle.test.references
    lam = own.lambda_ref if own and own.lambda_ref is not None else cell.lambda_ref
    amr = own.all_miss_token_rate if own and own.all_miss_token_rate is not None else cell.all_miss_token_rate
    if lam is None or amr is None:
        raise ConfigError(
            f"cell {cell.name!r}: lambda_ref and all_miss_token_rate are needed (from E0a) to run a test; "
            "record them in the cell or in the test's references"
        )
    return {"lambda_ref": float(lam), "all_miss_token_rate": float(amr)}


def execute_run(
    bundle: TestBundle,
    arm_name: str,
    rate: float,
    seed: int,
    engine: str,
    run_dir: Path | str,
    *,
    observer: Observer | None = None,
    options: dict[str, Any] | None = None,
    registration: dict[str, Any] | None = None,
    expect_plan_sha256: str | None = None,
    extra_meta: Mapping[str, Any] | None = None,
) -> RunResult:
    """Plan, freeze, drive and record one run into `run_dir` (which must not hold a run yet).

    `registration` ({name, path, sha256, commit}) binds the run: it goes into meta.json as is
    (a job script that checked the registration passes it); without it the test config's
    `registration` field is recorded. `expect_plan_sha256`: the frozen plan must have this hash (a
    registration's), or nothing is driven and the run is recorded REFUSED with both hashes.
    `extra_meta` is merged into meta.json before the run starts (a job's registration binding and
    scheduler facts)."""
    t0 = time.monotonic()
    key, arm = find_arm(bundle, arm_name)
    backend = get_backend(engine)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    refs = references(bundle)
    plan_path = run_dir / PLAN_FILE
    plan_made = make_plan(bundle.workload, bundle.protocol, arm, rate, refs["lambda_ref"], seed, bundle.test.top_rate)
    sha = write_plan(plan_made, plan_path)
    plan = read_plan(plan_path)
    if plan.sha256 != sha:
        raise RuntimeError(f"{plan_path}: hash changed between write and read")
    cap = arm.gate_cap(bundle.test.cap)
    meta = RunMeta(
        test=bundle.test.name,
        test_file=str(bundle.path) if bundle.path else None,
        registration=registration if registration is not None else bundle.test.registration,
        rule=bundle.test.rule,
        rule_params=bundle.test.rule_params,
        reference_source=bundle.test.references.source if bundle.test.references else None,
        arm=key,
        arm_config=arm,
        rate=float(rate),
        rate_abs=float(rate) * refs["lambda_ref"],
        seed=int(seed),
        references=refs,
        cap=cap,
        cell=bundle.cell,
        workload=bundle.workload,
        protocol=bundle.protocol,
        plan=PlanRecord(PLAN_FILE, sha, plan.meta.get("counts"), plan.top_rate),
        engine_backend=engine,
        provenance=capture(include_gpu=engine != "sim"),
        extra=dict(extra_meta or {}),
    )
    if expect_plan_sha256 is not None:
        meta.plan_check = PlanCheck(registered=expect_plan_sha256.lower(), generated=sha)
    if meta.plan_check is not None and not meta.plan_check.ok:
        reason = (
            f"plan SHA-256 {sha} of {key} x {rate:g} seed {seed} differs from the registered "
            f"{meta.plan_check.registered}: the configs no longer generate the registered plan"
        )
        with RunRecorder(run_dir, meta.to_json()) as rec:
            rec.close(RunStatus.REFUSED, reason)
        return RunResult(
            str(run_dir), key, float(rate), int(seed), RunStatus.REFUSED, reason, time.monotonic() - t0, 0.0
        )
    with RunRecorder(run_dir, meta.to_json()) as rec:
        client = arm_client(plan.sessions, plan.workload, arm, cap, rec)
        ctx = RunContext(
            bundle, arm, rate, seed, run_dir, client, rec, bundle.protocol.duration, observer, dict(options or {})
        )
        res = backend(ctx)
        client.close(res.end_time)
        open_loop = open_loop_summary(
            client.start_lateness("base"), client.start_lateness("burst"), bundle.test.start_lateness_p99
        )
        warn = warning_text(open_loop)
        warnings = [warn] if warn else []
        rec.update_meta(
            {
                **res.meta,
                "client": client.counters(),
                "open_loop": open_loop,
                "warnings": warnings,
                "end_time": res.end_time,
                "wall_s": time.monotonic() - t0,
            }
        )
        rec.close(res.status, res.reason)
    return RunResult(
        str(run_dir),
        key,
        float(rate),
        int(seed),
        res.status,
        res.reason,
        time.monotonic() - t0,
        res.end_time,
        open_loop=open_loop,
        warnings=warnings,
    )


# ---------------------------------------------------------------------------------------------
# checks before a whole test (the pool that runs it is runs/suite.py)
# ---------------------------------------------------------------------------------------------
def planned_runs(bundle: TestBundle) -> list[tuple[str, float, int]]:
    """Every (arm, rate, seed) of the test, slowest first (burst arms without a gate, high rates)."""
    runs = [(a, r, s) for a in bundle.arms for r in bundle.test.rates for s in bundle.test.seeds]

    def cost(x: tuple[str, float, int]) -> tuple[int, float]:
        arm = bundle.arms[x[0]]
        trapped_like = arm.burst and arm.gate is None
        return (0 if trapped_like else 1, -x[1])

    return sorted(runs, key=cost)


def refuse_existing_runs(out: Path, todo: list[tuple[str, float, int]]) -> None:
    """A run folder of `todo` under `out` that already holds a run: a fresh --out is needed, since
    runs are never overwritten."""
    for arm, rate, seed in todo:
        if (out / run_name(arm, rate, seed) / "meta.json").exists():
            raise ConfigError(f"{out / run_name(arm, rate, seed)} already holds a run; choose a fresh --out")


def check_before_runs(bundle: TestBundle, engine: str, rule: Any = None) -> None:
    """What would otherwise fail in every run, or only in the verdict once every run is done:
    the engine backend, the references the plans need, and an expectation in the rule for every
    arm. Raises ConfigError before anything is started."""
    get_backend(engine)
    references(bundle)
    rule = rule if rule is not None else bundle.rule_path
    where = f"rule {rule}" if rule is not None and not isinstance(rule, dict) else f"rule {bundle.test.rule!r}"
    try:
        # the rule the verdict will use: the one given, else the test's file, else the test's rule by name
        spec = load_rule(rule if rule is not None else bundle.test.rule, bundle.test.rule_params)
        # the roles name the arms the rule judges: each required one must run (a role that plays
        # only when the test registers its arm, E2's, need not) ...
        names = {a.lower() for a in bundle.arms}
        for role, r in spec["roles"].items():
            want = [r["arm"]] if isinstance(r["arm"], str) else list(r["arm"])
            required = r.get("required", True) is True and not r.get("registered_only")
            if required and not any(a.lower() in names for a in want):
                raise RuleError(f"role {role!r} needs an arm in {want}, which the test does not run")
        # ... and a rule that states what each arm must show has an expectation for every arm run
        if arm_expectations(spec):
            for name in bundle.arms:
                arm_expectation(spec, name)
    except (RuleError, OSError) as exc:
        raise ConfigError(f"{bundle.path or bundle.test.name}: arms {list(bundle.arms)}: {where}: {exc}") from None
    # The rule measures with its own bins and spans; a protocol scaled to a faster cell must come
    # with a rule scaled alike, or every run would be judged on the paper's clock (state X).
    p = bundle.protocol
    clash = [
        f"{k} {spec['params'][k]:g} (protocol {getattr(p, k):g})"
        for k in ("min_window", "backlog_bin", "recovered_span")
        if k in spec["params"] and float(spec["params"][k]) != float(getattr(p, k))
    ]
    if clash:
        raise ConfigError(
            f"{bundle.path or bundle.test.name}: {where} does not match protocol {p.name!r}: {', '.join(clash)}; "
            "expected a rule whose time parameters are the protocol's (name it in the test's 'rule:' or pass --rule)"
        )
