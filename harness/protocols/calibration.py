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
command. On a real engine every run gets a fresh server (launched through the engine adapter, with
the smoke checks and the flush + canary before it, or a cache-off check for E0a), the same clients
driven in wall time, and the same statistics (analysis/calibration.py). `calibrate all` writes
stage-c.yaml, e0a.yaml and e0b.yaml (docs/registration.md), each with the SHA-256 of the run
directories it summarises: the inputs `prereg fill` reads.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from analysis.calibration import (
    E0B_FINAL_MAX,
    E0B_RISE_MAX,
    E0B_RISE_SPAN,
    E0aSummary,
    E0bStats,
    WindowStats,
    curve_means,
    e0a_summary,
    e0b_stats,
    hit_crossing,
    window_stats,
)
from harness.client.closed import ClosedClient
from harness.config import ArmConfig, CellConfig, ProtocolConfig, WorkloadConfig
from harness.refengine.model import EngineModel
from harness.drivers.virtual import SimResult, simulate
from harness.workload.draws import expected_turns

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
) -> ClosedRun:
    """One closed-population run of warmup + window seconds, and its window statistics.

    `engine` None runs the engine model in virtual time; an EngineOptions (harness.protocols.realrun) runs
    the same client against a real server, which needs `run_dir` for its log and records.
    """
    end = warmup + window
    if engine is not None:
        return _run_closed_real(cell, workload, n, seed=seed, end=end, warmup=warmup, run_dir=run_dir,
                                meta=meta, gauge_interval=gauge_interval, options=engine)  # fmt: skip
    engine = EngineModel(cell, seed=seed)
    if run_dir is None:
        client = ClosedClient(workload, n, seed=seed)
        res = simulate(client, engine, until=end, gauge_interval=None)
        turns = pd.DataFrame(client.sink.turns)
        sessions = pd.DataFrame(client.sink.sessions)
    else:
        from harness.recording.record import RunRecorder, load_run

        rec = RunRecorder(run_dir, _closed_meta("sim", cell, workload, n, seed, warmup, window, meta))
        try:
            client = ClosedClient(workload, n, seed=seed, sink=rec)
            res = simulate(client, engine, recorder=rec, until=end, gauge_interval=gauge_interval)
            rec.update_meta({"simulation": res.as_meta()})
        except BaseException:
            rec.close("FAILED", "simulation raised")
            raise
        rec.close("COMPLETED")
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
    from provenance.meta import capture

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
    from harness.protocols.realrun import run_real
    from harness.recording.record import RunRecorder, load_run

    if run_dir is None:
        raise ValueError("a real-engine calibration run needs a run directory (--out)")
    rec = RunRecorder(run_dir, _closed_meta(options.engine, cell, workload, n, seed, warmup, end - warmup, meta))
    try:
        client = ClosedClient(workload, n, seed=seed, sink=rec)
        result = run_real(client, cell=cell, options=options, run_dir=run_dir, recorder=rec,
                          duration=end, gauge_interval=gauge_interval)  # fmt: skip
    except BaseException:
        rec.close("FAILED", "calibration run raised")
        raise
    rec.close()
    if result.status != "COMPLETED":
        raise RuntimeError(f"closed run n={n} seed={seed} ended {result.status}: {result.reason} (records in {run_dir})")
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
) -> list[WindowStats]:
    """μ(n) and hit fraction for each population n (and seed)."""
    out: list[WindowStats] = []
    for n in ns:
        for s in seeds:
            rd = None if out_dir is None else Path(out_dir) / f"stage-c-n{n}-s{s}"
            out.append(run_closed(cell, workload, n, seed=s, warmup=warmup, window=window, run_dir=rd,
                                  meta={"stage": "C"}, engine=engine).stats)  # fmt: skip
    return out


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
) -> E0aSummary:
    """λ_ref (turns-based all-miss session rate) and the all-miss uncached token rate. Pass a list
    as `runs` to receive the per-seed statistics too."""
    off = cache_off(cell)

    def one(pop: int, s: int) -> WindowStats:
        rd = None if out_dir is None else Path(out_dir) / f"e0a-n{pop}-s{s}"
        return run_closed(off, workload, pop, seed=s, warmup=warmup, window=window, run_dir=rd,
                          meta={"stage": "E0a"}, engine=engine).stats  # fmt: skip

    per_seed = [one(n, s) for s in seeds]
    check = one(check_n, seeds[0]) if check_n else None
    summary = e0a_summary(per_seed, check)
    if runs is not None:
        runs.extend(per_seed)
    return summary


# -- E0b ---------------------------------------------------------------------------------------
def e0b_protocol(duration: float = E0B_DURATION, rise_span: float = E0B_RISE_SPAN) -> ProtocolConfig:
    """The e0b protocol (configs/protocols/e0b.yaml), with another duration if asked: no burst,
    the statistics window = the last `rise_span` seconds."""
    from harness.config import config_ref, load_config

    base = load_config(config_ref("e0b", "protocols"), ProtocolConfig)
    data = base.model_dump(mode="json")
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
) -> E0bStats:
    """One E0b run: the frozen NOBURST plan at multiple x lambda_ref from an empty engine."""
    from harness.client.openloop import PlanClient
    from harness.config import config_ref, load_config
    from harness.workload.plans import make_plan, read_plan, write_plan

    prot = protocol or e0b_protocol(rise_span=rise_span)
    arm = load_config(config_ref("noburst", "arms"), ArmConfig)
    plan = make_plan(workload, prot, arm, multiple, lambda_ref, seed)
    stat_args = dict(multiple=multiple, seed=seed, lambda_ref=lambda_ref, duration=prot.duration, rise_span=rise_span,
                     bin_s=prot.backlog_bin, final_max=final_max, rise_max=rise_max)  # fmt: skip
    if run_dir is None and engine is None:
        client = PlanClient(plan.sessions, plan.workload)
        simulate(client, EngineModel(cell, seed=seed), until=prot.duration, gauge_interval=None)
        return e0b_stats(pd.DataFrame(client.sink.turns), pd.DataFrame(client.sink.sessions), **stat_args)  # type: ignore[arg-type]
    if run_dir is None:
        raise ValueError("a real-engine E0b run needs a run directory (--out)")
    from harness.recording.record import RunRecorder, load_run

    rd = Path(run_dir)
    rd.mkdir(parents=True, exist_ok=True)
    sha = write_plan(plan, rd / "plan.parquet")
    plan = read_plan(rd / "plan.parquet")
    kind = "sim" if engine is None else engine.engine
    meta = {**_closed_meta(kind, cell, workload, 0, seed, 0.0, prot.duration, {"stage": "E0b"}),
            "run_kind": "from_empty", "protocol": prot, "rate": float(multiple), "rate_abs": float(multiple) * lambda_ref,
            "references": {"lambda_ref": float(lambda_ref)}, "arm": "NOBURST",
            "plan": {"file": "plan.parquet", "sha256": sha, "counts": plan.meta.get("counts")}}  # fmt: skip
    meta.pop("population", None)
    rec = RunRecorder(rd, meta)
    try:
        client = PlanClient(plan.sessions, plan.workload, sink=rec)
        if engine is None:
            res = simulate(client, EngineModel(cell, seed=seed), recorder=rec, until=prot.duration, gauge_interval=prot.gauge_interval)
            rec.update_meta({"simulation": res.as_meta()})
            status, reason = "COMPLETED", None
        else:
            from harness.protocols.realrun import run_real

            result = run_real(client, cell=cell, options=engine, run_dir=rd, recorder=rec, duration=prot.duration,
                              gauge_interval=prot.gauge_interval)  # fmt: skip
            status, reason = result.status, result.reason
        client.close(prot.duration)
    except BaseException:
        rec.close("FAILED", "E0b run raised")
        raise
    rec.close(status, reason) if engine is None else rec.close()
    if status != "COMPLETED":
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
    duration: float = E0B_DURATION,
    rise_span: float = E0B_RISE_SPAN,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    out_dir: Path | str | None = None,
    engine: Any = None,
) -> list[E0bStats]:
    """Every (multiple, seed) of the grid from empty; the same seed's arrivals nest across multiples."""
    prot = e0b_protocol(duration, rise_span)
    out: list[E0bStats] = []
    for m in grid:
        for s in seeds:
            rd = None if out_dir is None else Path(out_dir) / f"e0b-m{m:g}-s{s}"
            out.append(run_from_empty(cell, workload, m, lambda_ref, seed=s, protocol=prot, rise_span=rise_span,
                                      final_max=final_max, rise_max=rise_max, run_dir=rd, engine=engine))  # fmt: skip
    return out


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
    e0b_duration: float = E0B_DURATION,
    rise_span: float = E0B_RISE_SPAN,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    engine: Any = None,
    engine_name: str = "sim",
    log: Any = None,
) -> Bundle:
    """Stage C, E0a, then E0b at multiples of the λ_ref E0a just measured; writes stage-c.yaml,
    e0a.yaml and e0b.yaml into `out` (run directories under `runs_dir`, default out/runs)."""
    from prereg.inputs import e0a_summary_dict, e0b_summary_dict, stage_c_summary, write_summary

    out = Path(out)
    runs = Path(runs_dir) if runs_dir is not None else out / "runs"
    say = log or (lambda msg: None)
    src = (f"agentload calibrate all --cell {cell.name} --engine {engine_name}: Stage C n={list(ns)} seeds {list(stage_c_seeds)} "
           f"({warmup:g} s + {window:g} s); E0a n={e0a_n} seeds {list(e0a_seeds)} check n={check_n}; "
           f"E0b grid {list(grid)} seeds {list(e0b_seeds)}, {e0b_duration:g} s")  # fmt: skip
    say(f"Stage C: n = {list(ns)}")
    sc = stage_c(cell, workload, ns, seeds=stage_c_seeds, out_dir=runs, warmup=warmup, window=window, engine=engine)
    sc_dirs = [runs / f"stage-c-n{n}-s{s}" for n in ns for s in stage_c_seeds]
    say(f"E0a: n = {e0a_n}, seeds {list(e0a_seeds)}")
    per_seed: list[WindowStats] = []
    ea = e0a(cell, workload, seeds=e0a_seeds, n=e0a_n, check_n=check_n, out_dir=runs, warmup=warmup, window=window,
             engine=engine, runs=per_seed)  # fmt: skip
    ea_dirs = [runs / f"e0a-n{e0a_n}-s{s}" for s in e0a_seeds] + ([runs / f"e0a-n{check_n}-s{e0a_seeds[0]}"] if check_n else [])
    lam = ea.lambda_ref
    say(f"E0b: grid {list(grid)} x lambda_ref = {lam:.5f} sessions/s")
    eb = e0b(cell, workload, lam, grid=grid, seeds=e0b_seeds, duration=e0b_duration, rise_span=rise_span,
             final_max=final_max, rise_max=rise_max, out_dir=runs, engine=engine)  # fmt: skip
    eb_dirs = [runs / f"e0b-m{m:g}-s{s}" for m in grid for s in e0b_seeds]
    files: dict[str, tuple[Path, str]] = {}
    docs = {
        "stage-c": stage_c_summary(cell.name, sc, warmup=warmup, window=window, run_dirs=sc_dirs, folder=out, source=src),
        "e0a": e0a_summary_dict(cell.name, per_seed, ea, n=e0a_n, warmup=warmup, window=window, run_dirs=ea_dirs, folder=out, source=src),
        "e0b": e0b_summary_dict(cell.name, eb, lambda_ref=lam, grid=list(grid), seeds=list(e0b_seeds), duration=e0b_duration,
                                rise_span=rise_span, final_max=final_max, rise_max=rise_max, run_dirs=eb_dirs, folder=out, source=src),
    }  # fmt: skip
    for stage, data in docs.items():
        path = out / f"{stage}.yaml"
        files[stage] = (path, write_summary(data, path))
    return Bundle(files, sc, ea, eb)


# -- command line ------------------------------------------------------------------------------------
def _fmt_curve(stats: Sequence[WindowStats]) -> str:
    m = curve_means(stats)
    lines = [f"{'n':>5} {'mu sess/s':>10} {'mu turns':>9} {'hit':>6} {'uncached tok/s':>15} {'seeds':>5}"]
    for r in m.itertuples():
        lines.append(f"{r.n:>5} {r.mu_sessions:>10.4f} {r.mu_turns:>9.4f} {r.hit_fraction:>6.3f} {r.uncached_token_rate:>15.0f} {r.seeds:>5}")
    peak = m.loc[m["mu_sessions"].idxmax()]
    lines.append(f"peak mu* = {peak.mu_sessions:.4f} sessions/s at n = {int(peak.n)}; "
                 f"0.5-hit crossing at n = {hit_crossing(m['n'], m['hit_fraction']):.1f}")  # fmt: skip
    return "\n".join(lines)


def _fmt_e0a(s: E0aSummary) -> str:
    lines = [
        f"lambda_ref (turns-based) = {s.lambda_ref:.4f} ± {s.lambda_ref_se:.4f} sessions/s over {s.seeds} seeds",
        f"completed sessions       = {s.lambda_sessions:.4f} ± {s.lambda_sessions_se:.4f} sessions/s",
        f"all-miss uncached tokens = {s.all_miss_token_rate:.0f} ± {s.all_miss_token_rate_se:.0f} tokens/s",
    ]
    if s.check is not None:
        c = s.check
        lines.append(f"check n={c.n}: {c.mu_turns:.4f} sessions/s turns-based, {c.uncached_token_rate:.0f} tokens/s")
    return "\n".join(lines)


def _fmt_e0b(stats: Sequence[E0bStats]) -> str:
    lines = [f"{'x ref':>6} {'seed':>4} {'sessions':>8} {'realized':>8} {'final':>7} {'rise':>7} {'hit':>6}  stable"]
    for s in stats:
        lines.append(f"{s.multiple:>6g} {s.seed:>4} {s.sessions:>8} {s.realized_multiple:>8.3f} {s.final_backlog:>7.1f} {s.rise:>7.1f} "
                     f"{s.hit_fraction:>6.3f}  {'yes' if s.stable else 'NO'}")  # fmt: skip
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _cmd(args: Any) -> int:
    from harness.cli import CLIError
    from harness.config import config_ref, load_config

    cell = load_config(config_ref(args.cell, "cells"), CellConfig)
    workload = load_config(config_ref(args.workload, "workloads"), WorkloadConfig)
    out = Path(args.out) if args.out else None
    engine = None
    if args.engine != "sim":
        from harness.protocols.realrun import options_from_args

        if out is None:
            raise CLIError(f"--engine {args.engine}: a real-engine calibration needs --out for its server logs and run records")
        engine = options_from_args(args, cell_ref=args.cell)
    if args.stage == "all":
        if out is None:
            raise CLIError("calibrate all: --out DIR is required (the three summaries are written there)")
        bundle = calibrate_all(
            cell, workload, out, runs_dir=args.runs_dir, ns=_ints(args.n) if args.n else STAGE_C_NS,
            stage_c_seeds=_ints(args.stage_c_seeds), e0a_seeds=_ints(args.e0a_seeds), e0a_n=args.e0a_n,
            check_n=args.check_n or None, warmup=args.warmup, window=args.window,
            grid=_floats(args.grid) if args.grid else E0B_GRID, e0b_seeds=_ints(args.e0b_seeds),
            e0b_duration=args.duration, rise_span=args.rise_span, final_max=args.final_max, rise_max=args.rise_max,
            engine=engine, engine_name=args.engine, log=lambda m: print(m, file=sys.stderr),
        )  # fmt: skip
        print(_fmt_curve(bundle.stage_c))
        print()
        print(_fmt_e0a(bundle.e0a))
        print()
        print(_fmt_e0b(bundle.e0b))
        for stage, (path, sha) in bundle.files.items():
            print(f"wrote {path}  sha256 {sha}", file=sys.stderr)
        return 0
    if args.stage == "stage-c":
        stats = stage_c(cell, workload, _ints(args.n) if args.n else STAGE_C_NS, seeds=_ints(args.seeds or "0"),
                        out_dir=out, warmup=args.warmup, window=args.window, engine=engine)  # fmt: skip
        print(_fmt_curve(stats))
        result: Any = [s.as_dict() for s in stats]
    elif args.stage == "e0a":
        summary = e0a(cell, workload, seeds=_ints(args.seeds or "0,1,2"), n=int(args.n or E0A_N),
                      check_n=args.check_n or None, out_dir=out, warmup=args.warmup, window=args.window,
                      engine=engine)  # fmt: skip
        print(_fmt_e0a(summary))
        result = summary.as_dict()
    else:
        lam = args.lambda_ref or cell.lambda_ref
        if lam is None:
            raise CLIError(f"calibrate e0b: cell {cell.name!r} has no lambda_ref; give --lambda-ref (E0a's turns-based rate)")
        stats_b = e0b(cell, workload, float(lam), grid=_floats(args.grid) if args.grid else E0B_GRID, seeds=_ints(args.seeds or "0"),
                      duration=args.duration, rise_span=args.rise_span, final_max=args.final_max, rise_max=args.rise_max,
                      out_dir=out, engine=engine)  # fmt: skip
        print(_fmt_e0b(stats_b))
        result = [s.as_dict() for s in stats_b]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.stage}.json").write_text(json.dumps({"cell": cell.name, "stage": args.stage, "result": result}, indent=2))
        print(f"wrote {out / (args.stage + '.json')}", file=sys.stderr)
    return 0


def _e0b_options(q: Any) -> None:
    q.add_argument("--grid", help="comma-separated multiples of lambda_ref (default 1.25,1.5,1.75,2.0,2.5,3.0)")
    q.add_argument("--duration", type=float, default=E0B_DURATION, help="seconds per E0b run (3000)")
    q.add_argument("--rise-span", type=float, default=E0B_RISE_SPAN, help="the rise is fitted over the last span (1500 s)")
    q.add_argument("--final-max", type=float, default=E0B_FINAL_MAX, help="stable needs the final backlog below this (50)")
    q.add_argument("--rise-max", type=float, default=E0B_RISE_MAX, help="stable needs the fitted rise at most this (10)")


def register(cli: Any) -> None:
    """Add `agentload calibrate stage-c|e0a|e0b|all` (see harness/cli.py for the pattern)."""
    p = cli.command("calibrate", group="calibrate", help="run a calibration stage (Stage C, E0a, E0b) or all three on a cell")
    p.set_defaults(_parser=p)
    sub = p.add_subparsers(dest="stage", metavar="STAGE")
    for name, help_ in (
        ("stage-c", "closed-population curve: μ(n) and hit fraction per population n"),
        ("e0a", "all-miss capacity with the prefix cache off: λ_ref and the uncached token rate"),
        ("e0b", "from-empty stability at a grid of multiples of λ_ref: the edge"),
        ("all", "Stage C, E0a and E0b in turn; writes stage-c.yaml, e0a.yaml, e0b.yaml (the registration's inputs)"),
    ):
        q = sub.add_parser(name, help=help_, description=help_)
        q.add_argument("--cell", required=True, help="cell config (name under configs/cells or a path)")
        q.add_argument("--workload", default="standard", help="workload config (default: standard)")
        q.add_argument("--engine", default="sim", choices=["sim", "sglang", "vllm", "emulator"],
                       help="where to run: 'sim' = the engine model in virtual time; otherwise a fresh "
                            "server per run, launched from the cell (see the real-engine options)")  # fmt: skip
        if name == "all":
            q.add_argument("--n", help="Stage C populations, comma-separated (default the nine of record)")
            q.add_argument("--stage-c-seeds", default="0", help="Stage C seeds (0)")
            q.add_argument("--e0a-seeds", default="0,1,2", help="E0a seeds (0,1,2)")
            q.add_argument("--e0a-n", type=int, default=E0A_N, help="E0a population (32)")
            q.add_argument("--e0b-seeds", default="0", help="E0b arrival seeds (0)")
            q.add_argument("--runs-dir", help="where the run directories go (default OUT/runs)")
        else:
            q.add_argument("--seeds", help="comma-separated seeds (stage-c and e0b default 0; e0a default 0,1,2)")
        if name in ("stage-c", "e0a"):
            q.add_argument("--n", help="stage-c: comma-separated populations (default the nine of record); e0a: population (32)")
        if name in ("e0a", "all"):
            q.add_argument("--check-n", type=int, default=E0A_CHECK_N, help="saturation check population (0: none)")
        if name in ("e0b", "all"):
            _e0b_options(q)
        if name == "e0b":
            q.add_argument("--lambda-ref", type=float, help="the unit of the grid (default: the cell's lambda_ref)")
        q.add_argument("--warmup", type=float, default=WARMUP, help="closed runs: seconds before the window (900)")
        q.add_argument("--window", type=float, default=WINDOW, help="closed runs: window length, seconds (1800)")
        q.add_argument("--out", required=name == "all", help="directory for run records and summaries")
        from harness.protocols.realrun import add_engine_arguments

        add_engine_arguments(q)
        q.set_defaults(func=_cmd)
