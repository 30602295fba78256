"""Commands: `agentload differential`, `agentload calibrate costs`, `agentload replay`.

- differential --engine vllm|sglang: the engine model against the engine's own scheduling and cache
  code on the default trace suite (needs AGENTLOAD_<ENGINE>_PYTHON); agreement per decision kind.
- calibrate costs --engine vllm|sglang --cell CELL: the iteration-cost fit to the engine's per-request
  timings (new short closed runs, or --from-runs), to the calibration summaries (--inputs: E0a and
  Stage C, through the simulator), or to both jointly; a cost file with its sources' SHA-256, the
  residuals per point and the points left out.
- replay RUN_DIR_OR_FOLDER... [--cost FILE | --cost-from-meta]: each run's frozen plan, arm and cell
  through the simulator, and a parity report (Markdown, JSON, figure) against the real run, with both
  runs classed by the registered rule; a folder stands for every run under it (a whole test). Costs
  that are not the run's engine's on its cell are refused (sim2real/replay.py says why).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from analysis.calibration_summaries import E0a, InputError, StageC, load_summary
from analysis.rules import is_paired_form, load_rule
from harness.config import CellConfig, WorkloadConfig, config_ref, load_config, load_cost_file
from harness.errors import AgentloadError, UsageError
from harness.recording.schema import meta_files_under
from prereg.registration import load_registration
from runs.closed_runs import cache_off, e0a, run_closed, stage_c
from runs.realrun import add_engine_arguments, options_from_args
from sim2real import parity
from sim2real.costfit import CostFitError, fit_from_runs, rows_from_runs
from sim2real.quota import replay_speed_factor
from sim2real.replay import replay_costs, replay_run
from sim2real.replay_margin import replay_margin, run_speed_noise
from sim2real.suite import run_suite, write_report
from sim2real.summaryfit import (
    Simulator,
    SummaryFit,
    cost_start,
    fit_summaries,
    sources,
    summary_points,
    timing_start,
)
from sim2real.traces import default_suite


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# -- differential ------------------------------------------------------------------------------------
def _cmd_differential(args: argparse.Namespace) -> int:
    specs = default_suite(seeds=args.seeds)
    if args.family:
        keep = set(args.family.split(","))
        specs = [s for s in specs if s.name in keep]
    summary = run_suite(args.engine, specs, python=args.python)
    path = write_report(summary, args.out)
    print(path.read_text())
    print(f"wrote {path} and {Path(args.out) / 'differential.json'} ({summary['wall_s']} s)", file=sys.stderr)
    return 0


# -- calibrate costs ---------------------------------------------------------------------------------
def add_costs_stage(sub: Any) -> None:
    """The `costs` stage of `agentload calibrate` (the calibration command owns the parser)."""
    help_ = (
        "iteration-cost model fitted to the engine's per-request timings, the calibration summaries, or both "
        "(a cost file with its sources' hashes and residuals)"
    )
    q = sub.add_parser("costs", help=help_, description=help_)
    q.add_argument("--cell", required=True, help="cell config (name under configs/cells or a path)")
    q.add_argument("--workload", default="standard", help="workload config (default: standard)")
    q.add_argument(
        "--engine",
        default="vllm",
        choices=["vllm", "sglang"],
        help="the engine whose costs are fitted (new runs: vLLM reports per-request timings; SGLang's runs "
        "without them are fitted from --inputs)",
    )
    q.add_argument(
        "--inputs",
        default=None,
        metavar="DIR",
        help="calibration summaries (stage-c.yaml, e0a.yaml) to fit through the simulator; with runs that carry "
        "timings the fit is joint",
    )
    q.add_argument(
        "--base-cost",
        default=None,
        metavar="FILE",
        help="summaries only: the cost whose shape is scaled (default: the cell's own costs)",
    )
    q.add_argument(
        "--timing-weight",
        type=float,
        default=0.1,
        help="joint fit: the timing rows' mean squared relative residual counts this many summary points (0.1: "
        "they shape the cost, the summaries decide it; on a quota'd CPU the engine's own intervals miss the front "
        "end's share of a request's cost)",
    )
    q.add_argument(
        "--reference-weight",
        type=float,
        default=1.0,
        help="summaries: each of E0a's two points (lambda_ref and the all-miss token rate, the references a rule "
        "judges every run against) counts this many points (default 1, like each Stage C point)",
    )
    q.add_argument(
        "--hit-drop",
        type=float,
        default=0.1,
        help="Stage C points with a hit fraction this far below the curve's best are left out (0.1)",
    )
    q.add_argument("--max-evaluations", type=int, default=40, help="simulated evaluations of the summaries (40)")
    q.add_argument(
        "--n", default="8,32", help="comma-separated closed populations (default 8,32: low and high concurrency)"
    )
    q.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    q.add_argument("--warmup", type=float, default=10.0, help="seconds before the window (default 10)")
    q.add_argument(
        "--window", type=float, default=40.0, help="seconds after the warm-up (default 40); the fit uses every request"
    )
    q.add_argument(
        "--cache",
        choices=["off", "on"],
        default="off",
        help="prefix cache during the runs (default off: no hit enters even as a regressor)",
    )
    q.add_argument(
        "--from-runs", nargs="+", default=None, metavar="RUN_DIR", help="fit these runs instead of making new ones"
    )
    q.add_argument(
        "--quota-scaled",
        action="store_true",
        help="the runs ran under CPU quotas (their meta.json records each): scale every run's timings to the runs' "
        "mean quota and write it as the cost's cpu_quota, so that a replay plays each run at speed x its quota / "
        "cpu_quota (a CFS quota of q CPUs computes q CPU-seconds a second); needs --from-runs",
    )
    q.add_argument("--name", default=None, help="cost file name (default: <cell>-fitted)")
    q.add_argument("--out", required=True, help="directory for the runs, the cost file and the residuals")

    add_engine_arguments(q)
    q.set_defaults(func=_cmd_costs)


def _load_inputs(folder: Path) -> tuple[StageC | None, E0a | None, dict[str, Path]]:
    """The Stage C and E0a summaries of an inputs folder (either may be absent, not both)."""
    files: dict[str, Path] = {}
    sc = ea = None
    for stage in ("stage-c", "e0a"):
        p = folder / f"{stage}.yaml"
        if p.exists():
            files[stage] = p
            m = load_summary(p, stage)
            if isinstance(m, StageC):
                sc = m
            elif isinstance(m, E0a):
                ea = m
    if not files:
        raise UsageError(f"--inputs {folder}: neither stage-c.yaml nor e0a.yaml is there; expected one or both")
    return sc, ea, files


def _err(message: str) -> None:
    print(message, file=sys.stderr)


def _print_points(fit: SummaryFit) -> None:
    print(f"{'point':34s} {'real':>10s} {'sim':>10s} {'rel':>7s}  fitted")
    for r in fit.point_rows():
        label = f"{r['stage']} n={r['n']} {r['measure']}"
        why = "yes" if r["fitted"] else f"no: {r['left_out']}"
        print(f"{label:34s} {r['real']:>10.4g} {r['simulated']:>10.4g} {r['rel']:>+7.3f}  {why}")


def _cmd_costs(args: argparse.Namespace) -> int:
    cell = load_config(config_ref(args.cell, "cells"), CellConfig)
    if cell.engine.name != args.engine:
        raise UsageError(f"--engine {args.engine}: cell {cell.name!r} is a {cell.engine.name} cell")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = load_config(config_ref(args.workload, "workloads"), WorkloadConfig)
    separate = cell.batching == "separate"
    dirs: list[Path] = []
    if not args.reference_weight > 0:
        raise UsageError(f"--reference-weight {args.reference_weight:g}: expected a weight > 0")
    if args.reference_weight != 1.0 and args.inputs is None:
        raise UsageError(
            f"--reference-weight {args.reference_weight:g} weights E0a's points in the summary fit: give --inputs DIR "
            "with the calibration summaries, or leave it out"
        )
    if args.quota_scaled and not args.from_runs:
        raise UsageError(
            "--quota-scaled scales the timings of recorded runs by their quotas: give --from-runs RUN_DIR ..."
        )
    if args.from_runs:
        dirs = [Path(d) for d in args.from_runs]
    elif args.inputs is None:
        if args.engine != "vllm":
            raise UsageError(
                f"--engine {args.engine}: its runs carry no per-request timings to fit; give --inputs DIR (the "
                "calibration summaries) or --from-runs with runs that carry them"
            )
        run_cell = cache_off(cell) if args.cache == "off" else cell
        options = options_from_args(args, cell_ref=args.cell)  # the vLLM adapter asks for per-request timings
        for n in _ints(args.n):
            for s in _ints(args.seeds):
                d = out / f"costs-n{n}-s{s}"
                if (d / "meta.json").exists():
                    raise UsageError(f"{d} already holds a run; use --from-runs to fit it, or another --out")
                run_closed(
                    run_cell,
                    workload,
                    n,
                    seed=s,
                    warmup=args.warmup,
                    window=args.window,
                    run_dir=d,
                    meta={"stage": "costs", "cache": args.cache},
                    engine=options,
                )
                dirs.append(d)
    name = args.name or f"{cell.name}-fitted"
    path = out / f"{name}.yaml"
    engine_label = f"{cell.engine.name} {cell.engine.version} ({cell.name})"
    if args.inputs is None:
        try:
            fit = fit_from_runs(dirs, cell.chunked_prefill, separate=separate, quota_scaled=args.quota_scaled)
        except CostFitError as exc:
            raise UsageError(str(exc)) from None
        doc = fit.cost_file(name, engine_label)
        doc = owned_by(doc, cell.engine.name, cell.name)
        doc["fit"]["sources"] = sources({}, dirs, None)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert fit.per_row is not None
        fit.per_row.to_csv(out / f"{name}.residuals.csv", index=False)
        p = fit.params
        print(
            f"a = {p['a'] * 1e3:.4f} ms, b = {p['b'] * 1e6:.4f} us/token, c_p = {p['c_p'] * 1e9:.4f} ns/pair, "
            f"c_d = {p['c_d'] * 1e3:.4f} ms per request per 8192 tokens of context, c_r = {p['c_r'] * 1e3:.4f} ms "
            f"per request (f0 = 0, chunk {fit.chunk})"
        )
        for k, r in fit.residuals.items():
            print(
                f"  {k:7s} n={r['n']:5d}  median rel {r['median_rel']:+.3f}  median |rel| {r['median_abs_rel']:.3f}  "
                f"p90 |rel| {r['p90_abs_rel']:.3f}"
            )
        _print_quota(fit.quota)
        print(f"wrote {path} and {out / (name + '.residuals.csv')}", file=sys.stderr)
        return 0
    try:
        stage_c_s, e0a_s, files = _load_inputs(Path(args.inputs))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    points = summary_points(stage_c_s, e0a_s, hit_drop=args.hit_drop)
    sim = Simulator(
        cell,
        workload,
        (stage_c_s.protocol.warmup_s, stage_c_s.protocol.window_s) if stage_c_s else (0.0, 1.0),
        (e0a_s.protocol.warmup_s, e0a_s.protocol.window_s) if e0a_s else (0.0, 1.0),
        stage_c,
        e0a,
    )
    base = None
    try:
        timing = (
            rows_from_runs(dirs, cell.chunked_prefill, separate=separate, quota_scaled=args.quota_scaled)
            if dirs
            else None
        )
        if timing is not None:
            start = timing_start(timing)
        else:
            base = Path(args.base_cost) if args.base_cost else None
            start = cost_start(load_cost_file(base) if base else cell.cost)
        sfit = fit_summaries(
            points,
            sim,
            start,
            cell.chunked_prefill,
            timing=timing,
            timing_weight=args.timing_weight,
            max_evaluations=args.max_evaluations,
            log=_err,
            reference_weight=args.reference_weight,
        )
    except CostFitError as exc:
        raise UsageError(str(exc)) from None
    sfit.sources = sources(files, dirs, base)
    doc = sfit.cost_file(name, engine_label)
    doc = owned_by(doc, cell.engine.name, cell.name)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    if timing is not None:
        timing.per_row(sfit.theta()).to_csv(out / f"{name}.residuals.csv", index=False)
    p = sfit.params
    print(
        f"{sfit.method}: a = {p['a'] * 1e3:.4f} ms, f0 = {p['f0'] * 1e3:.4f} ms, b = {p['b'] * 1e6:.4f} us/token, "
        f"c_p = {p['c_p'] * 1e9:.4f} ns/pair, c_d = {p['c_d'] * 1e3:.4f} ms per request per 8192 tokens, "
        f"c_r = {p['c_r'] * 1e3:.4f} ms per request, d_r = {p.get('d_r', 0.0) * 1e3:.4f} ms per response "
        f"({sfit.evaluations} evaluations, {sfit.sim_runs} simulated runs)"
    )
    _print_points(sfit)
    if timing is not None:
        for k, r in timing.residuals(sfit.theta()).items():
            print(
                f"  timing {k:7s} n={r['n']:5d}  median rel {r['median_rel']:+.3f}  "
                f"median |rel| {r['median_abs_rel']:.3f}"
            )
    _print_quota(timing.quota_record() if timing is not None else None)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _print_quota(record: dict[str, Any] | None) -> None:
    if record:
        qs = list(record["runs"].values())
        print(
            f"quota-scaled: the costs hold at {record['cpu_quota']:.4g} CPU (cpu_quota), the mean of {len(qs)} runs' "
            f"quotas {min(qs):.3g}-{max(qs):.3g}; a replay plays each run at speed x its quota / cpu_quota"
        )


def owned_by(doc: dict[str, Any], engine: str, cell: str) -> dict[str, Any]:
    """A cost file's document with the engine and cell it belongs to right after its name (a replay
    of a run on another engine or cell refuses it)."""
    head: dict[str, Any] = {k: doc[k] for k in ("kind", "name") if k in doc}
    return {**head, "engine": engine, "cells": [cell], **{k: v for k, v in doc.items() if k not in head}}


# -- replay ------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def run_dirs(paths: list[str], out: Path) -> list[Path]:
    """Each argument as given when it is a run directory (has meta.json); a folder without one
    stands for every run directory under it (a whole test), in name order, leaving out the
    replay output's own."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / "meta.json").is_file():
            found.append(p)
            continue
        if not p.is_dir():
            raise UsageError(f"replay: {p}: neither a run directory (no meta.json) nor a folder of runs")
        under = sorted(m.parent for m in meta_files_under(p) if not m.parent.resolve().is_relative_to(out.resolve()))
        if not under:
            raise UsageError(f"replay: {p}: no run directory (with a meta.json) under it")
        found.extend(under)
    return found


def _registration_path(ref: str) -> Path:
    p = Path(ref)
    return p if p.is_file() or p.is_absolute() else ROOT / ref


def run_rule(meta: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The rule a run is classed by, and where it came from: its registration's frozen rule when the
    run is bound to a registration that can be read with the recorded SHA-256 (and is a staged
    spec), else the rule the run names (its family's, with the run's parameter overrides)."""
    reg = meta.get("registration")
    why = ""
    if isinstance(reg, Mapping) and reg.get("path"):
        try:
            r = load_registration(_registration_path(str(reg["path"])), reg.get("sha256"))
            if not is_paired_form(r.rule):
                return load_rule(r.rule), f"registration {r.name}"
            why = f"; registration {r.name}'s rule is in the old paired form"
        except AgentloadError as exc:
            why = f"; registration unreadable: {exc}"
    name = meta.get("rule") or None
    return load_rule(name, meta.get("rule_params")), f"named rule {name or 'e2 (default)'}{why}"


def _cmd_replay(args: argparse.Namespace) -> int:
    out = Path(args.out)
    dirs = run_dirs(args.run_dir, out)
    metas = {}
    for rd in dirs:  # every run's costs checked before any replay starts
        meta = json.loads((rd / "meta.json").read_text())
        try:
            cost, _ = replay_costs(rd, meta, args.cost, args.cost_from_meta)
            if cost is not None:  # a quota-scaled cost needs the run's quota
                replay_speed_factor(meta, cost.cpu_quota, str(rd))
        except ValueError as exc:  # a foreign cost (ConfigError is one), or a run without the quota its cost needs
            raise UsageError(str(exc)) from None
        metas[rd] = meta
    reports = []
    names = [rd.name for rd in dirs]
    for rd in dirs:
        name = rd.name if names.count(rd.name) == 1 else "-".join(rd.parts[-2:])
        sim_dir = out / "replays" / name
        replay_run(rd, sim_dir, cost_file=args.cost, cost_from_meta=args.cost_from_meta)
        spec, source = run_rule(metas[rd])
        report = parity.compare(
            rd,
            sim_dir,
            bands=parity.Bands(args.hit_tol, args.backlog_abs, args.backlog_rel, args.band_frac, args.hit_noise_z),
            spec=spec,
            rule_source=source,
        )
        if args.margins:
            noise, noise_from = run_speed_noise(metas[rd], ROOT)
            print(f"{name}: flip margin of the replayed state (bisection, a replay per step)...", file=sys.stderr)
            report["margin"] = {
                **replay_margin(
                    rd,
                    args.cost,
                    spec,
                    base_state=None,  # judged at factor 1 as every step is (the report's state may be a status)
                    noise=noise,
                    cost_from_meta=args.cost_from_meta,
                ),
                "noise_from": noise_from,
            }
        reports.append(report)
    paths = parity.write(reports, out)
    print(paths["markdown"].read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def register(cli: Any) -> None:
    p = cli.command(
        "differential", group="calibrate", help="the engine model against a real engine's own scheduler and cache code"
    )
    p.add_argument("--engine", required=True, choices=["vllm", "sglang"])
    p.add_argument(
        "--python",
        default=None,
        help="the engine venv's python (default $AGENTLOAD_VLLM_PYTHON / $AGENTLOAD_SGLANG_PYTHON)",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds per trace family (default 3)")
    p.add_argument("--family", default=None, help="comma-separated trace families (default all)")
    p.add_argument("--out", default="results/differential", help="report directory")
    p.set_defaults(func=_cmd_differential)

    p = cli.command(
        "replay", group="judge", help="replay real runs in the simulator (their plan, arm, cell) and report parity"
    )
    p.add_argument("run_dir", nargs="+", help="run directories, or folders of runs (a whole test: every run under it)")
    p.add_argument(
        "--cost",
        default=None,
        help="cost file for the simulator; it must name the runs' engine and cell (`engine:`, `cells:`); "
        "`agentload calibrate costs --from-runs` fits one",
    )
    p.add_argument(
        "--cost-from-meta",
        action="store_true",
        help="replay real runs with the costs in their meta.json (not fitted to their engine); the report marks it",
    )
    p.add_argument("--out", default="results/replay", help="directory for the replays and the parity report")
    p.add_argument("--hit-tol", type=float, default=0.10, help="hit-fraction band, absolute (default 0.10)")
    p.add_argument("--backlog-abs", type=float, default=5.0, help="backlog band, sessions (default 5)")
    p.add_argument("--backlog-rel", type=float, default=0.20, help="backlog band, relative (default 0.20)")
    p.add_argument("--band-frac", type=float, default=0.80, help="share of bins that must lie in band (default 0.80)")
    p.add_argument(
        "--hit-noise-z",
        type=float,
        default=2.0,
        help="the hit band widens to this many binomial standard errors of a bin's difference where that is more "
        "than --hit-tol (short bins hold few turns); 0: the fixed band (default 2)",
    )
    p.add_argument(
        "--margins",
        action="store_true",
        help="also find each replayed state's flip margin: the smallest change of the cost's speed, each way, that "
        "changes it (bisection: ~12 more replays a run), labelled knife-edge within the E0a noise of the run's "
        "registration",
    )
    p.set_defaults(func=_cmd_replay)
