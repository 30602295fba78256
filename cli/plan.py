"""`agentload plan make | show`: freeze one plan to a file, or summarise one against its nominal law."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cli.commands import CLI
from harness.config import (
    DEFAULT_TOP_RATE,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    WorkloadConfig,
    config_ref,
    load_config,
)
from harness.errors import PlanError
from harness.workload.draws import expected_turns
from harness.workload.planfile import read_plan, write_plan
from harness.workload.plans import ks_exponential, make_plan, rate_report


def register(cli: CLI) -> None:
    """Add `agentload plan make|show` (see cli/main.py for the pattern)."""
    p = cli.command("plan", group="workload", help="make a frozen session plan (Parquet + SHA-256), or show one")
    p.set_defaults(_parser=p)
    sub = p.add_subparsers(dest="plan_action", metavar="ACTION")
    mk = sub.add_parser(
        "make",
        help="generate a plan and print its SHA-256",
        description=(
            "Generate the plan of one (workload, protocol, arm, rate, seed) and write it as Parquet. "
            "The same inputs give the same bytes (and hash) in any process."
        ),
    )
    mk.add_argument("--workload", required=True, help="workload config (name under configs/workloads or a path)")
    mk.add_argument("--protocol", required=True, help="protocol config")
    mk.add_argument("--arm", required=True, help="arm config")
    mk.add_argument("--rate", required=True, type=float, help="arrival rate as a multiple of lambda_ref")
    ref = mk.add_mutually_exclusive_group(required=True)
    ref.add_argument("--lambda-ref", type=float, help="reference rate lambda_ref, sessions/s")
    ref.add_argument("--cell", help="take lambda_ref from this cell config")
    mk.add_argument("--seed", required=True, type=int)
    mk.add_argument(
        "--top-rate",
        type=float,
        default=DEFAULT_TOP_RATE,
        help=f"sessions/s of the base stream rates are thinned from (default {DEFAULT_TOP_RATE:g}, the paper's; "
        "a test registers its own as top_rate)",
    )
    mk.add_argument("--out", help="output file (default: plan-<arm>-r<rate>-s<seed>.parquet)")
    mk.set_defaults(func=_cmd_make)
    sh = sub.add_parser(
        "show",
        help="sessions, turns and realized arrival rates against nominal",
        description="Summarize a plan: sessions, turns, realized arrival rate per window "
        "against nominal, and a KS test of base inter-arrival times against the exponential law.",
    )
    sh.add_argument("plan", help="plan file")
    sh.add_argument("--rows", type=int, default=10, help="session rows to list (default 10; 0 for none)")
    sh.add_argument("--all", action="store_true", help="list every session")
    sh.add_argument(
        "--window",
        action="append",
        default=None,
        metavar="START:END",
        help="report this window (seconds) instead of the defaults; repeatable",
    )
    sh.set_defaults(func=_cmd_show)


def _load_kind(ref: str, folder: str, model: type) -> Any:
    return load_config(config_ref(ref, folder), model)


def _cmd_make(args: Any) -> int:
    workload = _load_kind(args.workload, "workloads", WorkloadConfig)
    protocol = _load_kind(args.protocol, "protocols", ProtocolConfig)
    arm = _load_kind(args.arm, "arms", ArmConfig)
    lam = args.lambda_ref
    if args.cell is not None:
        cell = _load_kind(args.cell, "cells", CellConfig)
        if cell.lambda_ref is None:
            raise PlanError(f"cell {cell.name!r} has no lambda_ref (run E0a and record it, or pass --lambda-ref)")
        lam = cell.lambda_ref
    plan = make_plan(workload, protocol, arm, args.rate, lam, args.seed, args.top_rate)
    out = Path(args.out or f"plan-{arm.name}-r{args.rate:g}-s{args.seed}.parquet")
    digest = write_plan(plan, out)
    c = plan.meta["counts"]
    print(f"{digest}  {out}")
    print(
        f"# {c['base']} base + {c['burst']} burst sessions ({c['refused']} refused), {c['turns']} turns; "
        f"rate {args.rate:g} x {lam:g} = {plan.rate_abs:.6g} sessions/s, seed {args.seed}",
        file=sys.stderr,
    )
    return 0


def _parse_window(text: str) -> tuple[str, float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise PlanError(f"--window: got {text!r}; expected START:END in seconds, e.g. 5700:8700") from None
    if b <= a:
        raise PlanError(f"--window: got {text!r}; expected END > START")
    return (f"[{a:g}, {b:g})", a, b)


def _cmd_show(args: Any) -> int:
    plan = read_plan(args.plan)
    windows = [_parse_window(w) for w in args.window] if args.window else None
    m = plan.meta
    con = Console(width=None if sys.stdout.isatty() else 110)
    wl = plan.workload
    head = Table.grid(padding=(0, 2))
    head.add_row("plan", str(args.plan))
    head.add_row("sha256", plan.sha256 or "")
    head.add_row(
        "seed / rate", f"{m['seed']} / {m['rate']:g} x lambda_ref {m['lambda_ref']:g} = {m['rate_abs']:.6g} sessions/s"
    )
    head.add_row(
        "workload",
        f"{wl.name}: T = min(Geometric(1/{wl.turns.mean:g}), {wl.turns.cap}), E[T] = {expected_turns(wl):.3f}; "
        f"tool time Exp(mean {wl.tool_time.mean:g} s)",
    )
    arm = m["arm"]
    head.add_row(
        "protocol",
        f"{m['protocol']['name']}: {m['protocol']['duration']:g} s; burst {arm['burst_size']} at "
        f"{m['protocol']['burst']['time']:g} s; cut {arm['cut']}; shed {arm['shed']}",
    )
    head.add_row("generator", f"version {m['generator_version']}, top rate {m['top_rate']:g} sessions/s")
    con.print(head)

    summ = Table(title="sessions and turns")
    for col in ("kind", "sessions", "refused", "turns", "mean turns", "tool time (s)"):
        summ.add_column(col, justify="right" if col != "kind" else "left")
    for kind in ("base", "burst"):
        ss = plan.of_kind(kind)
        if not ss:
            continue
        turns = sum(s.n_turns for s in ss)
        summ.add_row(
            kind,
            str(len(ss)),
            str(sum(s.refused for s in ss)),
            str(turns),
            f"{turns / len(ss):.2f}",
            f"{sum(sum(s.tool_times) for s in ss):.0f}",
        )
    con.print(summ)

    n_rows = len(plan.sessions) if args.all else max(0, args.rows)
    if n_rows:
        rows = Table(title=f"sessions (first {min(n_rows, len(plan.sessions))} of {len(plan.sessions)}; id = row)")
        for col in ("id", "kind", "index", "arrival s", "turns", "tool s", "refused", "token seed"):
            rows.add_column(col, justify="right", no_wrap=True)
        for i, s in enumerate(plan.sessions[:n_rows]):
            rows.add_row(
                str(i),
                s.kind,
                str(s.index),
                f"{s.arrival:.3f}",
                str(s.n_turns),
                f"{sum(s.tool_times):.1f}",
                "yes" if s.refused else "",
                f"{s.token_seed:016x}",
            )
        con.print(rows)

    rt = Table(title="arrivals against nominal (base stream, refused included; z in Poisson s.d.)")
    for col in ("window", "span s", "arrivals", "nominal", "dev", "z", "x lambda_ref", "refused"):
        rt.add_column(col, justify="right" if col != "window" else "left", no_wrap=True)
    for r in rate_report(plan, windows):
        rt.add_row(
            r.label,
            f"[{r.start:g}, {r.end:g})",
            str(r.arrivals),
            f"{r.expected:.1f}",
            f"{100 * r.deviation:+.1f}%",
            f"{r.z:+.2f}" if r.kind == "base" else "",
            f"{r.realized_rate / plan.lambda_ref:.3f}" if r.kind == "base" else "",
            str(r.refused),
        )
    con.print(rt)
    ks = ks_exponential(plan)
    con.print(
        f"KS test of base inter-arrival times against the nominal exponential law (time-rescaled): "
        f"D = {ks.statistic:.4f}, p = {ks.pvalue:.3g}, n = {ks.n}"
    )
    return 0
