"""`agentload prereg design`: the test design step before registration (prereg/design.py).

Prints, for the template's own design, each registered rate's reachability per arm (the formula's
drain against the budget, the judged window against min_window, each arm's registered state in k
of n fresh simulated seeds at the fitted speed and at +-margin), says plainly when the rule can
only FAIL, searches the protocol's free knobs for the cheapest decisive design, and writes the
design record (prereg/design_record.py) that `prereg fill` binds when it lies in the inputs folder.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from analysis.rules import arm_expectations
from prereg.design import Context, load_context
from prereg.design_record import design_record, write_design
from prereg.design_search import Evaluated, Grid, SearchResult, margins, search
from prereg.filling import repo_root_of
from prereg.margin import DEFAULT_TOLERANCE
from prereg.scoring import margin_text


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _fractions(text: str) -> tuple[tuple[tuple[int, int], ...], ...]:
    """'1/3:2/3,1/4:1/2' -> (((1, 3), (2, 3)), ((1, 4), (1, 2)))."""
    out = []
    for group in text.split(","):
        pairs = []
        for f in group.split(":"):
            a, _, b = f.partition("/")
            pairs.append((int(a), int(b)))
        out.append(tuple(pairs))
    return tuple(out)


def format_evaluation(ev: Evaluated, ctx: Context, overhead_s: float, title: str) -> list[str]:
    fe = ev.formula
    lines = [title]
    p, rule = fe.protocol, fe.rule
    if p is None or rule is None:  # formula_eval sets the rule with the protocol
        return [*lines, f"  no valid protocol: {'; '.join(fe.reasons)}"]
    lines.append(
        f"  protocol: {p.duration:g} s runs, burst {p.burst.size} in [{p.burst.time:g}, "
        f"{p.burst.time + p.burst.width:g}) s, judged over [{p.window.start:g}, {p.window.end:g}) s (min_window "
        f"{rule['params'].get('min_window', p.min_window):g} s), backlog bins {p.backlog_bin:g} s, RECOVERED over "
        f"the last {p.recovered_span:g} s"
    )
    lines.append(
        f"  cap {fe.cap} (the cap rule at {fe.design.cap_fraction:g} mu*, mu(cap) = {fe.mu_cap:.4g} sessions/s), rates "
        + ", ".join(f"{m:g}" for m in fe.multiples)
        + " x lambda_ref; CAPPED drain budget "
        f"{fe.budget_s:,.0f} s"
    )
    counts = {(c.arm, c.rate, c.factor): c for c in (ev.sim.counts if ev.sim else [])}
    arms = [a.upper() for a in ctx.arms]
    want = {a: "/".join(arm_expectations(ctx.rule).get(a.upper(), [])) for a in arms}
    head = f"  {'rate':>5} {'lam/s':>7} {'CAPPED drain':>14} {'window':>12} " + " ".join(
        f"{a + ' ' + want[a]:>26}" for a in arms
    )
    lines.append(head)
    for d in fe.drains:
        m = d["rate"]
        dr = "never" if d["drain_s"] is None else f"{d['drain_s']:,.0f} s"
        cells = []
        for a in arms:
            xs = sorted(
                (c for (arm, r, _), c in counts.items() if arm == a and abs(r - m) < 1e-9), key=lambda c: c.factor
            )
            base = next((c for c in xs if c.factor == 1.0), None)
            if base is None:
                cells.append(f"{'-':>26}")
                continue
            other = " ".join(f"x{c.factor:g} {c.good}/{c.done}" for c in xs if c.factor != 1.0)
            cells.append(f"{f'{base.good}/{base.done}' + (f' ({other})' if other else ''):>26}")
        win = f"{p.window.end - p.window.start:g}/{rule['params'].get('min_window', p.min_window):g} s"
        lines.append(
            f"  {m:>5g} {d['lambda']:>7.4f} {dr + (' ok' if d['fits'] else ' NO'):>14} {win:>12} " + " ".join(cells)
        )
    reg = ev.sim.registered if ev.sim else []
    if reg:
        lines.append(
            f"  the registered seeds {ctx.seeds} at the fitted speed (the plans the test will play): "
            + ", ".join(f"{c.arm} at {c.rate:g} {c.good}/{c.done}" for c in reg)
        )
    for r in fe.reasons:
        lines.append(("  UNDECIDABLE: " if "can only FAIL" in r else "  formula: ") + r)
    lines.append(
        f"  full test {fe.runs} runs x ({fe.run_s:g} + {overhead_s:g}) s = {fe.engine_hours(overhead_s):.2f} "
        f"engine-hours; CI version (BURST + NOBURST of one seed) {fe.ci_seconds(overhead_s) / 60:.1f} min"
    )
    lines.append(
        "  DECISIVE: every arm's registered outcome is reachable" if ev.decisive else f"  not decisive: {ev.why_not()}"
    )
    return lines


def format_search(res: SearchResult, ctx: Context, overhead_s: float) -> list[str]:
    lines = format_evaluation(res.baseline, ctx, overhead_s, f"the template's design ({ctx.template_path}):")
    if res.proposal is res.baseline:
        return lines
    lines += [f"  over the limits set, so the search goes on: {r}" for r in res.baseline.over_limits]
    if not res.searched:
        return [*lines, "search: not run (--no-search)"]
    lines.append(
        f"search: {res.candidates} candidate designs, {res.pruned} unreachable by the formulas, {len(res.evaluated)} "
        f"simulated in order of engine-hours ({res.sim_runs} simulated runs in all)"
    )
    if res.proposal is None:
        lines.append(
            "  no decisive design found in the grid searched: widen it (--post-factors, --burst-factors, "
            "--time-factors) or raise --max-candidates; or change the cell (a smaller pool, a faster pinned speed)"
        )
        return lines
    lines += format_evaluation(res.proposal, ctx, overhead_s, f"proposal: {res.proposal.formula.design.label()}")
    return lines


def _cmd_design(args: argparse.Namespace) -> int:
    ctx = load_context(args.inputs, args.test, args.cost)
    grid = Grid(
        time_factors=_floats(args.time_factors),
        post_factors=_floats(args.post_factors),
        burst_factors=_floats(args.burst_factors),
        width_factors=_floats(args.width_factors),
        cap_fractions=_floats(args.cap_fractions),
        fractions=_fractions(args.fractions),
        kept_times=tuple(k.strip() for k in args.keep_times.split(",") if k.strip()),
    )
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if set(seeds) & set(ctx.seeds):
        raise SystemExit(
            f"prereg design: fresh seeds {seeds} overlap the template's seeds {ctx.seeds}; choose --first-seed outside "
            "them"
        )
    need = args.need if args.need is not None else max(1, args.seeds - 1)
    print(
        f"design of {ctx.template.name}: the simulator with cost {args.cost}; an arm's outcome is reachable where its "
        f"registered state holds in {need} of {args.seeds} fresh seeds ({seeds[0]}-{seeds[-1]}) at the fitted speed"
        + (f" and at x{1 - args.margin:g} and x{1 + args.margin:g}" if args.margin > 0 else "")
    )
    print(
        f"references (E0a): lambda_ref {ctx.lambda_ref:.4g} sessions/s, all-miss {ctx.all_miss:.0f} uncached tokens/s; "
        "simulated runs are judged with them by the registered rule"
    )
    t0 = time.monotonic()
    res = search(
        ctx,
        grid,
        seeds=seeds,
        need=need,
        margin=args.margin,
        overhead_s=args.overhead,
        max_candidates=0 if args.no_search else args.max_candidates,
        jobs=args.jobs,
        echo=print if args.verbose else None,
        max_hours=args.max_hours,
        max_ci_s=None if args.max_ci_minutes is None else 60 * args.max_ci_minutes,
    )
    mg = None
    if res.proposal is not None and args.flip_margins:
        mg = margins(ctx, res.proposal.formula, seeds, tol=args.margin_tol)
    print("\n".join(format_search(res, ctx, args.overhead)))
    if mg:
        print(
            "flip margins of the proposal (smallest relative change of the cost's speed or of lambda_ref that flips "
            "the fresh seeds' modal state, by bisection; knife-edge: inside E0a's seed spread):"
        )
        for m in mg:
            print(
                f"  {m['arm']:8} x {m['rate']:<5g} {m['state']:10} {'>' if not m['bounded'] else ''}{m['margin']:.3f} "
                f"{m['label']:10} ({margin_text(m)})"
            )
    settings: dict[str, Any] = {
        "seeds": seeds,
        "need": need,
        "margin": args.margin,
        "overhead_s": args.overhead,
        "max_candidates": args.max_candidates,
        "max_hours": args.max_hours,
        "max_ci_minutes": args.max_ci_minutes,
        "grid": {
            "time_factors": list(grid.time_factors),
            "post_factors": list(grid.post_factors),
            "burst_factors": list(grid.burst_factors),
            "width_factors": list(grid.width_factors),
            "cap_fractions": list(grid.cap_fractions),
            "fractions": [[list(f) for f in g] for g in grid.fractions],
            "kept_times": list(grid.kept_times),
        },
    }
    if args.out:
        rec = design_record(
            ctx, res, settings=settings, overhead_s=args.overhead, root=repo_root_of(Path(args.test)), margins=mg
        )
        sha = write_design(rec, args.out)
        print(
            f"design record -> {args.out} (sha256 {sha}); in the inputs folder as design.yaml, `prereg fill` binds it"
        )
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


def register(cli: Any) -> None:
    """Fill `agentload prereg design`'s parser (cli/prereg.py adds it; cli.commands.ACTIONS lists this
    module, so `prereg check` and `prereg fill` import none of the design step)."""
    d = cli.action_parser("prereg", "design")
    d.description = __doc__.split("\n\n")[0]
    d.add_argument("--inputs", required=True, help="folder with stage-c.yaml, e0a.yaml, e0b.yaml (the fill's inputs)")
    d.add_argument("--test", required=True, help="registration template (prereg/templates/*.yaml)")
    d.add_argument(
        "--cost",
        required=True,
        help="the cell's fitted cost file (configs/costs/*.yaml; `agentload calibrate costs` fits one)",
    )
    d.add_argument("--seeds", type=int, default=5, help="fresh simulated seeds per arm and rate (default 5)")
    d.add_argument(
        "--first-seed", type=int, default=1000, help="the first fresh seed (default 1000; never a registered seed)"
    )
    d.add_argument(
        "--need",
        type=int,
        default=None,
        help="seeds in which an arm must meet its registered state (default: all but one)",
    )
    d.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="the outcome must also hold at the cost's speed x (1 -+ margin) (default 0.1)",
    )
    d.add_argument(
        "--overhead",
        type=float,
        default=75.0,
        help="seconds a real run needs beyond its duration: start, pin, smoke, canary, stop (default 75)",
    )
    d.add_argument("--time-factors", default="1", help="every protocol and rule time x these (default 1)")
    d.add_argument(
        "--keep-times",
        default="",
        help="protocol times the time factors leave unscaled, comma-separated, of min_window, backlog_bin, hit_bin, "
        "recovered_span (e.g. recovered_span: a RECOVERED span scaled down holds too few turns to judge a hit "
        "fraction by; default none)",
    )
    d.add_argument(
        "--post-factors", default="1,1.5,2,3,4,6,8", help="the time after the burst x these (default 1,1.5,2,3,4,6,8)"
    )
    d.add_argument("--burst-factors", default="1,0.75,0.5,0.375,0.25,0.1875,0.125", help="the burst's size x these")
    d.add_argument("--width-factors", default="1,2", help="the burst's span x these (default 1,2)")
    d.add_argument(
        "--cap-fractions",
        default="0.95,0.9,0.85,0.8",
        help="the cap rule's fraction of mu* (default 0.95,0.9,0.85,0.8)",
    )
    d.add_argument(
        "--fractions",
        default="1/3:2/3,1/4:1/2,1/5:2/5,1/4:3/4",
        help="the rates' places across the window, pairs by ':'",
    )
    d.add_argument(
        "--max-candidates", type=int, default=60, help="candidates simulated at most, cheapest first (default 60)"
    )
    d.add_argument(
        "--max-hours", type=float, default=None, help="prune designs whose full test takes more engine-hours"
    )
    d.add_argument(
        "--max-ci-minutes",
        type=float,
        default=None,
        help="prune designs whose CI version (BURST + NOBURST of one seed) takes longer",
    )
    d.add_argument("--no-search", action="store_true", help="evaluate the template's design only")
    d.add_argument(
        "--flip-margins", action="store_true", help="also bisect the flip margin of every run of the proposal (slow)"
    )
    d.add_argument(
        "--margin-tol",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"bisection tolerance of the flip margins (default {DEFAULT_TOLERANCE:g})",
    )
    d.add_argument("--jobs", type=int, default=1, help="simulations in parallel (default 1)")
    d.add_argument("--verbose", action="store_true", help="print every candidate simulated")
    d.add_argument("--out", help="design record to write (YAML); as <inputs>/design.yaml the fill binds it")
    d.set_defaults(func=_cmd_design)
