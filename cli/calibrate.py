"""`agentload calibrate stage-c|e0a|e0b|all`: the calibration stages of
runs/calibration.py from the command line, with their tables.

A real engine needs `--out` (server logs and run records). A cell calibrated under a scaled
protocol names its E0b protocol (`--e0b-protocol e0b-cpu`) and the top rate its test registers
(`--top-rate`); `--resume` summarises matching COMPLETED runs already in the output folder instead
of running them again (a stage that died on a shared machine continues where it stopped).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.calibration import (
    E0B_FINAL_MAX,
    E0B_RISE_MAX,
    E0aSummary,
    E0bStats,
    WindowStats,
    curve_means,
    hit_crossing,
)
from cli.run import add_executor_options, sweep_executor
from cli.sim2real import add_costs_stage
from harness.config import (
    DEFAULT_TOP_RATE,
    CellConfig,
    WorkloadConfig,
    config_ref,
    load_config,
    load_cost_file,
)
from harness.errors import UsageError
from runs.calibration import (
    E0A_CHECK_N,
    E0A_N,
    E0B_GRID,
    STAGE_C_NS,
    WARMUP,
    WINDOW,
    calibrate_all,
    e0a,
    e0b,
    stage_c,
    write_e0a_file,
    write_stage_c_file,
)
from runs.realrun import add_engine_arguments, options_from_args


def _fmt_curve(stats: Sequence[WindowStats]) -> str:
    m = curve_means(stats)
    lines = [f"{'n':>5} {'mu sess/s':>10} {'mu turns':>9} {'hit':>6} {'uncached tok/s':>15} {'seeds':>5}"]
    for r in m.itertuples():
        lines.append(
            f"{r.n:>5} {r.mu_sessions:>10.4f} {r.mu_turns:>9.4f} {r.hit_fraction:>6.3f} {r.uncached_token_rate:>15.0f} "
            f"{r.seeds:>5}"
        )
    peak = m.iloc[int(m["mu_sessions"].to_numpy().argmax())]  # curve_means numbers its rows 0..
    lines.append(
        f"peak mu* = {peak.mu_sessions:.4f} sessions/s at n = {int(peak.n)}; "
        f"0.5-hit crossing at n = {hit_crossing(m['n'].tolist(), m['hit_fraction'].tolist()):.1f}"
    )
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
        lines.append(
            f"{s.multiple:>6g} {s.seed:>4} {s.sessions:>8} {s.realized_multiple:>8.3f} {s.final_backlog:>7.1f} "
            f"{s.rise:>7.1f} {s.hit_fraction:>6.3f}  {'yes' if s.stable else 'NO'}"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _cmd(args: Any) -> int:
    cell = load_config(config_ref(args.cell, "cells"), CellConfig)
    if args.cost:
        if args.engine not in ("sim", "emulator"):
            raise UsageError(
                f"--cost {args.cost}: a cost file sets the engine model's iteration costs (--engine sim or "
                f"emulator); a real engine ({args.engine}) has its own speed"
            )
        # the cell as the engine model runs it with these costs: what a fitted cost predicts for the stage
        cell = cell.model_copy(update={"cost": load_cost_file(args.cost), "cost_file": None})
    workload = load_config(config_ref(args.workload, "workloads"), WorkloadConfig)
    out = Path(args.out) if args.out else None
    engine = None
    if args.engine != "sim":
        if out is None:
            raise UsageError(
                f"--engine {args.engine}: a real-engine calibration needs --out for its server logs and run records"
            )
        engine = options_from_args(args, cell_ref=args.cell)
    mapper = None
    if args.executor == "slurm":
        if out is None:
            raise UsageError(
                "--executor slurm: give --out (the tasks' logs and the accounting export are written there)"
            )
        mapper = sweep_executor(args, out, f"calibrate-{args.stage}-{cell.name}")
    if args.stage == "all":
        if out is None:
            raise UsageError("calibrate all: --out DIR is required (the three summaries are written there)")
        bundle = calibrate_all(
            cell,
            workload,
            out,
            runs_dir=args.runs_dir,
            ns=_ints(args.n) if args.n else STAGE_C_NS,
            stage_c_seeds=_ints(args.stage_c_seeds),
            e0a_seeds=_ints(args.e0a_seeds),
            e0a_n=args.e0a_n,
            check_n=args.check_n or None,
            warmup=args.warmup,
            window=args.window,
            grid=_floats(args.grid) if args.grid else E0B_GRID,
            e0b_seeds=_ints(args.e0b_seeds),
            e0b_duration=args.duration,
            rise_span=args.rise_span,
            final_max=args.final_max,
            rise_max=args.rise_max,
            engine=engine,
            engine_name=args.engine,
            log=lambda m: print(m, file=sys.stderr),
            e0b_protocol_ref=args.e0b_protocol,
            top_rate=args.top_rate,
            resume=args.resume,
            mapper=mapper,
        )
        print(_fmt_curve(bundle.stage_c))
        print()
        print(_fmt_e0a(bundle.e0a))
        print()
        print(_fmt_e0b(bundle.e0b))
        for _stage, (path, sha) in bundle.files.items():
            print(f"wrote {path}  sha256 {sha}", file=sys.stderr)
        if mapper is not None:
            print(f"SLURM accounting of the arrays: {mapper.export_accounting(out / 'provenance')}", file=sys.stderr)
        return 0
    written: tuple[Path, str] | None = None  # the stage's summary in the registration's input format
    if args.stage == "stage-c":
        stats = stage_c(
            cell,
            workload,
            _ints(args.n) if args.n else STAGE_C_NS,
            seeds=_ints(args.seeds or "0"),
            out_dir=out,
            warmup=args.warmup,
            window=args.window,
            engine=engine,
            resume=args.resume,
            mapper=mapper,
        )
        print(_fmt_curve(stats))
        result: Any = [s.as_dict() for s in stats]
        if out is not None:
            written = write_stage_c_file(
                cell,
                workload,
                stats,
                out,
                ns=_ints(args.n) if args.n else STAGE_C_NS,
                seeds=_ints(args.seeds or "0"),
                warmup=args.warmup,
                window=args.window,
                engine=engine,
                engine_name=args.engine,
            )
    elif args.stage == "e0a":
        per_seed: list[Any] = []
        e0a_seeds, e0a_n, check_n = _ints(args.seeds or "0,1,2"), int(args.n or E0A_N), args.check_n or None
        summary = e0a(
            cell,
            workload,
            seeds=e0a_seeds,
            n=e0a_n,
            check_n=check_n,
            out_dir=out,
            warmup=args.warmup,
            window=args.window,
            engine=engine,
            runs=per_seed,
            resume=args.resume,
            mapper=mapper,
        )
        print(_fmt_e0a(summary))
        result = summary.as_dict()
        if out is not None:
            written = write_e0a_file(
                cell,
                workload,
                per_seed,
                summary,
                out,
                seeds=e0a_seeds,
                n=e0a_n,
                check_n=check_n,
                warmup=args.warmup,
                window=args.window,
                engine=engine,
                engine_name=args.engine,
            )
    else:
        lam = args.lambda_ref or cell.lambda_ref
        if lam is None:
            raise UsageError(
                f"calibrate e0b: cell {cell.name!r} has no lambda_ref; give --lambda-ref (E0a's turns-based rate)"
            )
        stats_b = e0b(
            cell,
            workload,
            float(lam),
            grid=_floats(args.grid) if args.grid else E0B_GRID,
            seeds=_ints(args.seeds or "0"),
            duration=args.duration,
            rise_span=args.rise_span,
            final_max=args.final_max,
            rise_max=args.rise_max,
            out_dir=out,
            engine=engine,
            protocol=args.e0b_protocol,
            top_rate=args.top_rate,
            resume=args.resume,
            mapper=mapper,
        )
        print(_fmt_e0b(stats_b))
        result = [s.as_dict() for s in stats_b]
    if mapper is not None and out is not None:
        print(f"SLURM accounting of the array(s): {mapper.export_accounting(out / 'provenance')}", file=sys.stderr)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.stage}.json").write_text(
            json.dumps({"cell": cell.name, "stage": args.stage, "result": result}, indent=2)
        )
        print(f"wrote {out / (args.stage + '.json')}", file=sys.stderr)
    if written is not None:
        print(f"wrote {written[0]}  sha256 {written[1]}  (the registration's input format)", file=sys.stderr)
    return 0


def _e0b_options(q: Any) -> None:
    q.add_argument("--grid", help="comma-separated multiples of lambda_ref (default 1.25,1.5,1.75,2.0,2.5,3.0)")
    q.add_argument(
        "--e0b-protocol",
        default="e0b",
        help="E0b protocol config: duration, window, backlog bins (default e0b: the paper's)",
    )
    q.add_argument(
        "--top-rate",
        type=float,
        default=DEFAULT_TOP_RATE,
        help="sessions/s of the base stream the arrivals are thinned from (the test's top_rate; default 2.0)",
    )
    q.add_argument(
        "--duration", type=float, default=None, help="seconds per E0b run (default: the protocol's, 3000 for e0b)"
    )
    q.add_argument(
        "--rise-span",
        type=float,
        default=None,
        help="the rise is fitted over the last span (default: the protocol's window, 1500 s)",
    )
    q.add_argument(
        "--final-max", type=float, default=E0B_FINAL_MAX, help="stable needs the final backlog below this (50)"
    )
    q.add_argument(
        "--rise-max", type=float, default=E0B_RISE_MAX, help="stable needs the fitted rise at most this (10)"
    )


def register(cli: Any) -> None:
    """Add `agentload calibrate stage-c|e0a|e0b|all|costs` (see cli/main.py for the pattern)."""
    p = cli.command(
        "calibrate", group="calibrate", help="run a calibration stage (Stage C, E0a, E0b) or all three on a cell"
    )
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
        q.add_argument(
            "--engine",
            default="sim",
            choices=["sim", "sglang", "vllm", "emulator"],
            help="where to run: 'sim' = the engine model in virtual time; otherwise a fresh "
            "server per run, launched from the cell (see the real-engine options)",
        )
        q.add_argument(
            "--cost",
            default=None,
            metavar="FILE",
            help="sim / emulator: a cost file (kind: cost) in place of the cell's costs, e.g. a fitted one",
        )
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
            q.add_argument(
                "--n", help="stage-c: comma-separated populations (default the nine of record); e0a: population (32)"
            )
        if name in ("e0a", "all"):
            q.add_argument("--check-n", type=int, default=E0A_CHECK_N, help="saturation check population (0: none)")
        if name in ("e0b", "all"):
            _e0b_options(q)
        if name == "e0b":
            q.add_argument("--lambda-ref", type=float, help="the unit of the grid (default: the cell's lambda_ref)")
        q.add_argument("--warmup", type=float, default=WARMUP, help="closed runs: seconds before the window (900)")
        q.add_argument("--window", type=float, default=WINDOW, help="closed runs: window length, seconds (1800)")
        q.add_argument("--out", required=name == "all", help="directory for run records and summaries")
        q.add_argument(
            "--resume",
            action="store_true",
            help="summarise a run directory that already holds a matching COMPLETED run instead of running it again",
        )

        add_engine_arguments(q)
        add_executor_options(q)
        q.set_defaults(func=_cmd)

    add_costs_stage(sub)
