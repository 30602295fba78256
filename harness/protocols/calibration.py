"""Calibration stages in the simulator: Stage C (closed curve μ(n)) and E0a (all-miss capacity).

Protocols (paper App. E.3): a closed population of n sessions starts at t = 0, a finished session
is replaced at once, and statistics are taken over a window after a warm-up (900 s + 1800 s).
Stage C runs the cell as configured for each n; E0a runs it with the prefix cache disabled at 32
sessions for seeds 0-2, plus a 64-session check that the engine is saturated (the token rate
should not move). Both write the same run records as a real run when given a directory.

`agentload calibrate stage-c|e0a --cell CELL --engine sim|emulator|vllm|sglang` is the command. On
a real engine every run gets a fresh server (launched through the engine adapter, with the smoke
checks and the flush + canary before it, or a cache-off check for E0a), the same closed client
driven in wall time, and the same statistics (analysis/calibration.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from analysis.calibration import E0aSummary, WindowStats, curve_means, e0a_summary, hit_crossing, window_stats
from harness.client.closed import ClosedClient
from harness.config import CellConfig, WorkloadConfig
from harness.refengine.model import EngineModel
from harness.drivers.virtual import SimResult, simulate
from harness.workload.draws import expected_turns

STAGE_C_NS = (16, 20, 24, 28, 32, 36, 48, 96, 300)
WARMUP = 900.0
WINDOW = 1800.0
E0A_SEEDS = (0, 1, 2)
E0A_N = 32
E0A_CHECK_N = 64


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
) -> E0aSummary:
    """λ_ref (turns-based all-miss session rate) and the all-miss uncached token rate."""
    off = cache_off(cell)

    def one(pop: int, s: int) -> WindowStats:
        rd = None if out_dir is None else Path(out_dir) / f"e0a-n{pop}-s{s}"
        return run_closed(off, workload, pop, seed=s, warmup=warmup, window=window, run_dir=rd,
                          meta={"stage": "E0a"}, engine=engine).stats  # fmt: skip

    per_seed = [one(n, s) for s in seeds]
    check = one(check_n, seeds[0]) if check_n else None
    return e0a_summary(per_seed, check)


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


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


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
    if args.stage == "stage-c":
        stats = stage_c(cell, workload, _ints(args.n) if args.n else STAGE_C_NS, seeds=_ints(args.seeds or "0"),
                        out_dir=out, warmup=args.warmup, window=args.window, engine=engine)  # fmt: skip
        print(_fmt_curve(stats))
        result: Any = [s.as_dict() for s in stats]
    else:
        summary = e0a(cell, workload, seeds=_ints(args.seeds or "0,1,2"), n=int(args.n or E0A_N),
                      check_n=args.check_n or None, out_dir=out, warmup=args.warmup, window=args.window,
                      engine=engine)  # fmt: skip
        print(_fmt_e0a(summary))
        result = summary.as_dict()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.stage}.json").write_text(json.dumps({"cell": cell.name, "stage": args.stage, "result": result}, indent=2))
        print(f"wrote {out / (args.stage + '.json')}", file=sys.stderr)
    return 0


def register(cli: Any) -> None:
    """Add `agentload calibrate stage-c|e0a|costs` (see harness/cli.py for the pattern)."""
    p = cli.command("calibrate", group="calibrate", help="run a calibration stage (Stage C, E0a) on a cell")
    p.set_defaults(_parser=p)
    sub = p.add_subparsers(dest="stage", metavar="STAGE")
    for name, help_ in (
        ("stage-c", "closed-population curve: μ(n) and hit fraction per population n"),
        ("e0a", "all-miss capacity with the prefix cache off: λ_ref and the uncached token rate"),
    ):
        q = sub.add_parser(name, help=help_, description=help_)
        q.add_argument("--cell", required=True, help="cell config (name under configs/cells or a path)")
        q.add_argument("--workload", default="standard", help="workload config (default: standard)")
        q.add_argument("--engine", default="sim", choices=["sim", "sglang", "vllm", "emulator"],
                       help="where to run: 'sim' = the engine model in virtual time; otherwise a fresh "
                            "server per run, launched from the cell (see the real-engine options)")  # fmt: skip
        q.add_argument("--seeds", help="comma-separated seeds (stage-c default 0; e0a default 0,1,2)")
        q.add_argument("--n", help="stage-c: comma-separated populations (default the nine of record); e0a: population (32)")
        if name == "e0a":
            q.add_argument("--check-n", type=int, default=E0A_CHECK_N, help="saturation check population (0: none)")
        q.add_argument("--warmup", type=float, default=WARMUP, help="seconds before the window (900)")
        q.add_argument("--window", type=float, default=WINDOW, help="window length, seconds (1800)")
        q.add_argument("--out", help="directory for run records and a JSON summary")
        from harness.protocols.realrun import add_engine_arguments

        add_engine_arguments(q)
        q.set_defaults(func=_cmd)
    from harness.sim2real.cli import add_costs_stage

    add_costs_stage(sub)
