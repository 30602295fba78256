"""Calibration stages: Stage C (closed curve μ(n)), E0a (all-miss capacity), E0b (from-empty edge),
and `calibrate all`, which runs the three and writes the registration's input summaries.

Protocols (paper App. E.3): a closed population of n sessions starts at t = 0, a finished session
is replaced at once, and statistics are taken over a window after a warm-up (900 s + 1800 s).
Stage C runs the cell as configured for each n; E0a runs it with the prefix cache disabled at 32
sessions for seeds 0-2, plus a 64-session check that the engine is saturated (the token rate
should not move). E0b plays Poisson arrivals (the NOBURST plan of the e0b protocol, so the
arrivals at each multiple are a CRN subset of the next) from an empty engine for 3000 s at a grid
of multiples of λ_ref; a run is stable iff its final backlog is below 50 and the fitted rise over
the last 1500 s is at most 10 (registered parameters). Every stage writes the same run records as
a real run when given a directory.

`agentload calibrate stage-c|e0a|e0b|all --cell CELL --engine sim|emulator|vllm|sglang` is the
command (cli/calibrate.py). On a real engine every run gets a fresh server (launched through the engine adapter, with
the smoke checks and the flush + canary before it, or a cache-off check for E0a), the same clients
driven in wall time, and the same statistics (analysis/calibration.py). `calibrate all` writes
stage-c.yaml, e0a.yaml and e0b.yaml (docs/registration.md), each with the SHA-256 of the run
directories it summarises: the inputs `prereg fill` reads.

A cell faster or slower than the paper's is calibrated under its own scaled protocol: the E0b
protocol is named (configs/protocols/e0b-cpu.yaml: the paper's times divided by the scale, bins
included), and its plans are thinned from a base stream at the test's registered top rate. With
`resume`, a run directory that already holds a COMPLETED run of the same population, seed,
times, cell and workload is summarised instead of run again: on a shared machine a stage that
died half way need not start over, and what was measured is what is summarised.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.calibration import (
    E0B_FINAL_MAX,
    E0B_RISE_MAX,
    E0B_RISE_SPAN,
    E0aSummary,
    E0bStats,
    WindowStats,
    e0a_summary,
    e0b_stats,
    window_stats,
)
from analysis.calibration_summaries import e0a_summary_dict, e0b_summary_dict, stage_c_summary, write_summary
from harness.client.closed import ClosedClient
from harness.client.openloop import PlanClient
from harness.config import (
    DEFAULT_TOP_RATE,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    WorkloadConfig,
    config_ref,
    load_config,
)
from harness.drivers.virtual import SimResult, simulate
from harness.recording.record import RunRecorder, load_run
from harness.recording.schema import RunStatus
from harness.refengine.model import EngineModel
from harness.workload.draws import expected_turns
from harness.workload.planfile import plan_bytes, read_plan, write_plan
from harness.workload.plans import make_plan
from provenance.meta import capture
from runs.realrun import run_real

STAGE_C_NS = (16, 20, 24, 28, 32, 36, 48, 96, 300)
WARMUP = 900.0
WINDOW = 1800.0
E0A_SEEDS = (0, 1, 2)
E0A_N = 32
E0A_CHECK_N = 64
E0B_GRID = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0)
E0B_SEEDS = (0,)
E0B_DURATION = 3000.0


@dataclass(frozen=True)
class ClosedRun:
    stats: WindowStats
    sim: SimResult


# Cell settings that change what the engine does (a cell's name, description, references and cost
# model do not): a run recorded under the same values measured the same thing.
ENGINE_FIELDS = (
    "engine",
    "model",
    "kv_pool_tokens",
    "page_size",
    "schedule_policy",
    "chunked_prefill",
    "max_running",
    "prefix_cache",
    "waiting_prefix_refresh",
    "batching",
    "context_length",
)


def completed_run(run_dir: Path | str | None, cell: CellConfig, workload: WorkloadConfig, want: dict[str, Any]) -> bool:
    """Does `run_dir` hold a COMPLETED run of this cell's engine settings, this workload and the
    `want` meta values (population, seed, warm-up, ...)? Then it can be summarised, not rerun."""
    if run_dir is None:
        return False
    path = Path(run_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if meta.get("status") != RunStatus.COMPLETED:
        return False
    c = cell.model_dump(mode="json")
    got_cell = meta.get("cell") or {}
    if any(got_cell.get(k) != c.get(k) for k in ENGINE_FIELDS):
        return False
    if meta.get("workload") != workload.model_dump(mode="json"):
        return False
    return all(_same(meta.get(k), v) for k, v in want.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return bool(a == b)


def run_closed(
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    *,
    seed: int = 0,
    warmup: float = WARMUP,
    window: float = WINDOW,
    run_dir: Path | str | None = None,
    meta: dict[str, Any] | None = None,
    gauge_interval: float = 5.0,
    engine: Any = None,
    resume: bool = False,
) -> ClosedRun:
    """One closed-population run of warmup + window seconds, and its window statistics.

    `engine` None runs the engine model in virtual time; an EngineOptions (runs.realrun) runs
    the same client against a real server, which needs `run_dir` for its log and records. With
    `resume`, a matching COMPLETED run already in `run_dir` is summarised instead (stats only).
    """
    end = warmup + window
    kind = "sim" if engine is None else engine.engine
    want = {
        "run_kind": "closed",
        "engine_kind": kind,
        "population": n,
        "seed": seed,
        "warmup": warmup,
        "window": window,
    }
    if resume and completed_run(run_dir, cell, workload, want):
        data = load_run(run_dir)  # type: ignore[arg-type]
        return ClosedRun(
            window_stats(data.turns, data.sessions, warmup, end, expected_turns(workload), n=n, seed=seed), None
        )  # type: ignore[arg-type]
    if engine is not None:
        return _run_closed_real(
            cell,
            workload,
            n,
            seed=seed,
            end=end,
            warmup=warmup,
            run_dir=run_dir,
            meta=meta,
            gauge_interval=gauge_interval,
            options=engine,
        )
    engine = EngineModel(cell, seed=seed)
    if run_dir is None:
        client = ClosedClient(workload, n, seed=seed)
        res = simulate(client, engine, until=end, gauge_interval=None)
        turns = pd.DataFrame(client.sink.turns)
        sessions = pd.DataFrame(client.sink.sessions)
    else:
        rec = RunRecorder(run_dir, _closed_meta("sim", cell, workload, n, seed, warmup, window, meta))
        try:
            client = ClosedClient(workload, n, seed=seed, sink=rec)
            res = simulate(client, engine, recorder=rec, until=end, gauge_interval=gauge_interval)
            rec.update_meta({"simulation": res.as_meta()})
        except BaseException:
            rec.close(RunStatus.FAILED, "simulation raised")
            raise
        rec.close(RunStatus.COMPLETED)
        data = load_run(run_dir)
        turns, sessions = data.turns, data.sessions
    stats = window_stats(turns, sessions, warmup, end, expected_turns(workload), n=n, seed=seed)
    return ClosedRun(stats, res)


def _closed_meta(
    engine_kind: str,
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    seed: int,
    warmup: float,
    window: float,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """meta.json of one closed-population run, simulated or real (GPU facts only for a real one)."""
    return {
        "run_kind": "closed",
        "engine_kind": engine_kind,
        "provenance": capture(include_gpu=engine_kind != "sim"),
        "cell": cell,
        "workload": workload,
        "population": n,
        "seed": seed,
        "warmup": warmup,
        "window": window,
        **(extra or {}),
    }


def _run_closed_real(
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    *,
    seed: int,
    end: float,
    warmup: float,
    run_dir: Path | str | None,
    meta: dict[str, Any] | None,
    gauge_interval: float,
    options: Any,
) -> ClosedRun:
    if run_dir is None:
        raise ValueError("a real-engine calibration run needs a run directory (--out)")
    rec = RunRecorder(run_dir, _closed_meta(options.engine, cell, workload, n, seed, warmup, end - warmup, meta))
    try:
        client = ClosedClient(workload, n, seed=seed, sink=rec)
        result = run_real(
            client,
            cell=cell,
            options=options,
            run_dir=run_dir,
            recorder=rec,
            duration=end,
            gauge_interval=gauge_interval,
        )
    except BaseException:
        rec.close(RunStatus.FAILED, "calibration run raised")
        raise
    rec.close()
    if result.status != RunStatus.COMPLETED:
        raise RuntimeError(
            f"closed run n={n} seed={seed} ended {result.status}: {result.reason} (records in {run_dir})"
        )
    data = load_run(run_dir)
    stats = window_stats(data.turns, data.sessions, warmup, end, expected_turns(workload), n=n, seed=seed)
    return ClosedRun(stats, None)  # type: ignore[arg-type]


def stage_c(
    cell: CellConfig,
    workload: WorkloadConfig,
    ns: Sequence[int] = STAGE_C_NS,
    *,
    seeds: Sequence[int] = (0,),
    out_dir: Path | str | None = None,
    warmup: float = WARMUP,
    window: float = WINDOW,
    engine: Any = None,
    mapper: Mapper | None = None,
    resume: bool = False,
) -> list[WindowStats]:
    """μ(n) and hit fraction for each population n (and seed). `mapper` runs the runs elsewhere
    (e.g. slurm.sweep.SlurmSweep: one job array); the default runs them here, in order."""
    calls = [
        (
            cell,
            workload,
            n,
            s,
            warmup,
            window,
            None if out_dir is None else str(Path(out_dir) / f"stage-c-n{n}-s{s}"),
            {"stage": "C"},
            engine,
            resume,
        )
        for n in ns
        for s in seeds
    ]
    return list((mapper or serial)(closed_stats, calls))


Mapper = Callable[[Callable[..., Any], Sequence[tuple[Any, ...]]], Sequence[Any]]


def serial(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The default mapper: each call here, in order."""
    return [fn(*c) for c in calls]


def closed_stats(
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    seed: int,
    warmup: float,
    window: float,
    run_dir: str | None,
    meta: dict[str, Any],
    engine: Any,
    resume: bool = False,
) -> WindowStats:
    """One closed run's window statistics (a module-level function, so a job array can run it)."""
    return run_closed(
        cell,
        workload,
        n,
        seed=seed,
        warmup=warmup,
        window=window,
        run_dir=run_dir,
        meta=meta,
        engine=engine,
        resume=resume,
    ).stats


def cache_off(cell: CellConfig) -> CellConfig:
    return cell.model_copy(update={"prefix_cache": False})


def e0a(
    cell: CellConfig,
    workload: WorkloadConfig,
    *,
    seeds: Sequence[int] = E0A_SEEDS,
    n: int = E0A_N,
    check_n: int | None = E0A_CHECK_N,
    out_dir: Path | str | None = None,
    warmup: float = WARMUP,
    window: float = WINDOW,
    engine: Any = None,
    runs: list[WindowStats] | None = None,
    mapper: Mapper | None = None,
    resume: bool = False,
) -> E0aSummary:
    """λ_ref (turns-based all-miss session rate) and the all-miss uncached token rate. Pass a list
    as `runs` to receive the per-seed statistics too."""
    off = cache_off(cell)

    def call(pop: int, s: int) -> tuple[Any, ...]:
        rd = None if out_dir is None else str(Path(out_dir) / f"e0a-n{pop}-s{s}")
        return (off, workload, pop, s, warmup, window, rd, {"stage": "E0a"}, engine, resume)

    calls = [call(n, s) for s in seeds] + ([call(check_n, seeds[0])] if check_n else [])
    stats = list((mapper or serial)(closed_stats, calls))
    per_seed = stats[: len(seeds)]
    check = stats[len(seeds)] if check_n else None
    summary = e0a_summary(per_seed, check)
    if runs is not None:
        runs.extend(per_seed)
    return summary


# -- E0b ---------------------------------------------------------------------------------------
def e0b_protocol(duration: float | None = None, rise_span: float | None = None, base: str = "e0b") -> ProtocolConfig:
    """The E0b protocol `base` (configs/protocols/e0b.yaml, or a scaled one such as e0b-cpu), with
    another duration or rise span if asked (default: the protocol's duration and window): no
    burst, the statistics window = the last `rise_span` seconds, the backlog bins the protocol's."""
    cfg = load_config(config_ref(base, "protocols"), ProtocolConfig)
    duration = float(cfg.duration if duration is None else duration)
    rise_span = float(cfg.window.end - cfg.window.start if rise_span is None else rise_span)
    data = cfg.model_dump(mode="json")
    data.update(duration=float(duration), window={"start": float(duration - rise_span), "end": float(duration)})
    data["burst"] = {**data["burst"], "size": 0, "time": min(data["burst"]["time"], float(duration) / 2)}
    data["min_window"] = min(float(data["min_window"]), float(rise_span))
    return ProtocolConfig.model_validate(data)


def run_from_empty(
    cell: CellConfig,
    workload: WorkloadConfig,
    multiple: float,
    lambda_ref: float,
    *,
    seed: int = 0,
    protocol: ProtocolConfig | None = None,
    rise_span: float = E0B_RISE_SPAN,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    run_dir: Path | str | None = None,
    engine: Any = None,
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
) -> E0bStats:
    """One E0b run: the frozen NOBURST plan at multiple x lambda_ref from an empty engine, thinned
    from the base stream at `top_rate` sessions/s (a fast cell's test registers a higher one)."""
    prot = protocol or e0b_protocol(rise_span=rise_span)
    arm = load_config(config_ref("noburst", "arms"), ArmConfig)
    plan = make_plan(workload, prot, arm, multiple, lambda_ref, seed, top_rate)
    stat_args = dict(
        multiple=multiple,
        seed=seed,
        lambda_ref=lambda_ref,
        duration=prot.duration,
        rise_span=rise_span,
        bin_s=prot.backlog_bin,
        final_max=final_max,
        rise_max=rise_max,
    )
    kind = "sim" if engine is None else engine.engine
    want = {
        "run_kind": "from_empty",
        "engine_kind": kind,
        "seed": seed,
        "rate": float(multiple),
        "protocol": prot.model_dump(mode="json"),
        "references": {"lambda_ref": float(lambda_ref)},
    }
    if resume and completed_run(run_dir, cell, workload, want) and _plan_sha(run_dir) == _plan_sha256(plan):
        data = load_run(run_dir)  # type: ignore[arg-type]
        return e0b_stats(data.turns, data.sessions, **stat_args)  # type: ignore[arg-type]
    if run_dir is None and engine is None:
        client = PlanClient(plan.sessions, plan.workload)
        simulate(client, EngineModel(cell, seed=seed), until=prot.duration, gauge_interval=None)
        return e0b_stats(pd.DataFrame(client.sink.turns), pd.DataFrame(client.sink.sessions), **stat_args)  # type: ignore[arg-type]
    if run_dir is None:
        raise ValueError("a real-engine E0b run needs a run directory (--out)")

    rd = Path(run_dir)
    rd.mkdir(parents=True, exist_ok=True)
    sha = write_plan(plan, rd / "plan.parquet")
    plan = read_plan(rd / "plan.parquet")
    kind = "sim" if engine is None else engine.engine
    meta = {
        **_closed_meta(kind, cell, workload, 0, seed, 0.0, prot.duration, {"stage": "E0b"}),
        "run_kind": "from_empty",
        "protocol": prot,
        "rate": float(multiple),
        "rate_abs": float(multiple) * lambda_ref,
        "references": {"lambda_ref": float(lambda_ref)},
        "arm": "NOBURST",
        "plan": {"file": "plan.parquet", "sha256": sha, "counts": plan.meta.get("counts"), "top_rate": plan.top_rate},
    }
    meta.pop("population", None)
    rec = RunRecorder(rd, meta)
    try:
        client = PlanClient(plan.sessions, plan.workload, sink=rec)
        if engine is None:
            res = simulate(
                client,
                EngineModel(cell, seed=seed),
                recorder=rec,
                until=prot.duration,
                gauge_interval=prot.gauge_interval,
            )
            rec.update_meta({"simulation": res.as_meta()})
            status, reason = RunStatus.COMPLETED, None
        else:
            result = run_real(
                client,
                cell=cell,
                options=engine,
                run_dir=rd,
                recorder=rec,
                duration=prot.duration,
                gauge_interval=prot.gauge_interval,
            )
            status, reason = result.status, result.reason
        client.close(prot.duration)
    except BaseException:
        rec.close(RunStatus.FAILED, "E0b run raised")
        raise
    rec.close(status, reason) if engine is None else rec.close()
    if status != RunStatus.COMPLETED:
        raise RuntimeError(f"E0b run at {multiple} x lambda_ref seed {seed} ended {status}: {reason} (records in {rd})")
    data = load_run(rd)
    return e0b_stats(data.turns, data.sessions, **stat_args)  # type: ignore[arg-type]


def e0b(
    cell: CellConfig,
    workload: WorkloadConfig,
    lambda_ref: float,
    *,
    grid: Sequence[float] = E0B_GRID,
    seeds: Sequence[int] = E0B_SEEDS,
    duration: float | None = None,
    rise_span: float | None = None,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    out_dir: Path | str | None = None,
    engine: Any = None,
    protocol: str = "e0b",
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
    mapper: Mapper | None = None,
) -> list[E0bStats]:
    """Every (multiple, seed) of the grid from empty; the same seed's arrivals nest across multiples.
    `duration` and `rise_span` default to the named protocol's duration and window."""
    prot = e0b_protocol(duration, rise_span, protocol)
    rise_span = prot.window.end - prot.window.start
    calls = [
        (
            cell,
            workload,
            m,
            lambda_ref,
            s,
            prot,
            rise_span,
            final_max,
            rise_max,
            None if out_dir is None else str(Path(out_dir) / f"e0b-m{m:g}-s{s}"),
            engine,
            top_rate,
            resume,
        )
        for m in grid
        for s in seeds
    ]
    return list((mapper or serial)(from_empty_stats, calls))


def from_empty_stats(
    cell: CellConfig,
    workload: WorkloadConfig,
    multiple: float,
    lambda_ref: float,
    seed: int,
    protocol: ProtocolConfig,
    rise_span: float,
    final_max: float,
    rise_max: float,
    run_dir: str | None,
    engine: Any,
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
) -> E0bStats:
    """`run_from_empty` with positional arguments (a module-level function for job arrays)."""
    return run_from_empty(
        cell,
        workload,
        multiple,
        lambda_ref,
        seed=seed,
        protocol=protocol,
        rise_span=rise_span,
        final_max=final_max,
        rise_max=rise_max,
        run_dir=run_dir,
        engine=engine,
        top_rate=top_rate,
        resume=resume,
    )


def _plan_sha(run_dir: Path | str | None) -> str | None:
    try:
        return str(json.loads((Path(run_dir) / "meta.json").read_text())["plan"]["sha256"])  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _plan_sha256(plan: Any) -> str:
    return hashlib.sha256(plan_bytes(plan)).hexdigest()


# -- the bundle ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bundle:
    """What `calibrate all` wrote: the three summaries (path, SHA-256) and the statistics."""

    files: dict[str, tuple[Path, str]]
    stage_c: list[WindowStats]
    e0a: E0aSummary
    e0b: list[E0bStats]


def calibrate_all(
    cell: CellConfig,
    workload: WorkloadConfig,
    out: Path | str,
    *,
    runs_dir: Path | str | None = None,
    ns: Sequence[int] = STAGE_C_NS,
    stage_c_seeds: Sequence[int] = (0,),
    e0a_seeds: Sequence[int] = E0A_SEEDS,
    e0a_n: int = E0A_N,
    check_n: int | None = E0A_CHECK_N,
    warmup: float = WARMUP,
    window: float = WINDOW,
    grid: Sequence[float] = E0B_GRID,
    e0b_seeds: Sequence[int] = E0B_SEEDS,
    e0b_duration: float | None = None,
    rise_span: float | None = None,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    engine: Any = None,
    engine_name: str = "sim",
    log: Any = None,
    mapper: Mapper | None = None,
    e0b_protocol_ref: str = "e0b",
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
) -> Bundle:
    """Stage C, E0a, then E0b at multiples of the λ_ref E0a just measured; writes stage-c.yaml,
    e0a.yaml and e0b.yaml into `out` (run directories under `runs_dir`, default out/runs).
    E0b runs under the protocol `e0b_protocol_ref` (its duration and window unless given)."""
    out = Path(out)
    runs = Path(runs_dir) if runs_dir is not None else out / "runs"
    say = log or (lambda msg: None)
    eprot = e0b_protocol(e0b_duration, rise_span, e0b_protocol_ref)
    e0b_duration, rise_span = eprot.duration, eprot.window.end - eprot.window.start
    src = (
        f"agentload calibrate all --cell {cell.name} --engine {engine_name}: Stage C n={list(ns)} seeds {list(stage_c_seeds)} "
        f"({warmup:g} s + {window:g} s); E0a n={e0a_n} seeds {list(e0a_seeds)} check n={check_n}; "
        f"E0b {e0b_protocol_ref} grid {list(grid)} seeds {list(e0b_seeds)}, {e0b_duration:g} s"
    )
    if top_rate != DEFAULT_TOP_RATE:
        src += f", top rate {top_rate:g} sessions/s"
    say(f"Stage C: n = {list(ns)}")
    sc = stage_c(
        cell,
        workload,
        ns,
        seeds=stage_c_seeds,
        out_dir=runs,
        warmup=warmup,
        window=window,
        engine=engine,
        mapper=mapper,
        resume=resume,
    )
    sc_dirs = [runs / f"stage-c-n{n}-s{s}" for n in ns for s in stage_c_seeds]
    say(f"E0a: n = {e0a_n}, seeds {list(e0a_seeds)}")
    per_seed: list[WindowStats] = []
    ea = e0a(
        cell,
        workload,
        seeds=e0a_seeds,
        n=e0a_n,
        check_n=check_n,
        out_dir=runs,
        warmup=warmup,
        window=window,
        engine=engine,
        runs=per_seed,
        mapper=mapper,
        resume=resume,
    )
    ea_dirs = [runs / f"e0a-n{e0a_n}-s{s}" for s in e0a_seeds] + (
        [runs / f"e0a-n{check_n}-s{e0a_seeds[0]}"] if check_n else []
    )
    lam = ea.lambda_ref
    say(f"E0b: grid {list(grid)} x lambda_ref = {lam:.5f} sessions/s")
    eb = e0b(
        cell,
        workload,
        lam,
        grid=grid,
        seeds=e0b_seeds,
        duration=e0b_duration,
        rise_span=rise_span,
        final_max=final_max,
        rise_max=rise_max,
        out_dir=runs,
        engine=engine,
        protocol=e0b_protocol_ref,
        top_rate=top_rate,
        resume=resume,
        mapper=mapper,
    )
    eb_dirs = [runs / f"e0b-m{m:g}-s{s}" for m in grid for s in e0b_seeds]
    files: dict[str, tuple[Path, str]] = {}
    docs = {
        "stage-c": stage_c_summary(
            cell.name, sc, warmup=warmup, window=window, run_dirs=sc_dirs, folder=out, source=src + load_note(sc_dirs)
        ),
        "e0a": e0a_summary_dict(
            cell.name,
            per_seed,
            ea,
            n=e0a_n,
            warmup=warmup,
            window=window,
            run_dirs=ea_dirs,
            folder=out,
            source=src + load_note(ea_dirs),
        ),
        "e0b": e0b_summary_dict(
            cell.name,
            eb,
            lambda_ref=lam,
            grid=list(grid),
            seeds=list(e0b_seeds),
            duration=e0b_duration,
            rise_span=rise_span,
            final_max=final_max,
            rise_max=rise_max,
            run_dirs=eb_dirs,
            folder=out,
            source=src + load_note(eb_dirs),
            bin_s=eprot.backlog_bin,
            top_rate=top_rate,
            protocol=e0b_protocol_ref,
        ),
    }
    for stage, data in docs.items():
        path = out / f"{stage}.yaml"
        files[stage] = (path, write_summary(data, path))
    return Bundle(files, sc, ea, eb)


def load_note(run_dirs: Sequence[Path]) -> str:
    """The host load the real runs of a stage ran under, for its summary's `source` ('' for
    simulated runs): the range of the 1-minute load average over the drives and of the share of
    a core the engine got (meta.json host_load, runs/realrun.py)."""
    loads: list[float] = []
    shares: list[float] = []
    cpus = None
    for d in run_dirs:
        try:
            hl = json.loads((Path(d) / "meta.json").read_text()).get("host_load") or {}
        except (OSError, ValueError):
            continue
        cpus = hl.get("cpus", cpus)
        loads += [float(v[0]) for k, v in hl.items() if k in ("loadavg_drive_start", "loadavg_drive_end") and v]
        if hl.get("engine_cpu_share") is not None:
            shares.append(float(hl["engine_cpu_share"]))
    if not loads:
        return ""
    note = f"; host load (1 min) {min(loads):.1f}-{max(loads):.1f} on {cpus} CPUs"
    if shares:
        note += f", engine CPU share {min(shares):.2f}-{max(shares):.2f} of a core"
    return note
