"""`agentload theory model-f | curve | fluid`: the theory layer from the command line.

These print (or write) exactly what predictions are frozen from, so that a registration or a
prediction file can be re-derived by anyone from the committed configs and plans.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from analysis.rules import load_rule
from analysis.theory.entry import Server, all_miss_onset, demand_averaged_mu, onset_speed_law, predicted_curve
from analysis.theory.fluid import plan_fluid_from_plan
from analysis.theory.model_f import model_f_from_cost
from analysis.theory.moments import workload_moments
from analysis.theory.predict import freeze_predictions
from harness.config import CellConfig, WorkloadConfig, load_config, load_test
from harness.errors import UsageError
from harness.workload.planfile import read_plan


def _load(ref: str, folder: str, model: type) -> Any:
    name = ref if ("/" in ref or ref.endswith((".yaml", ".yml"))) else f"{folder}/{ref}"
    return load_config(name, model)


def _lambda_ref(cell: CellConfig, override: float | None) -> float:
    lr = override if override is not None else cell.lambda_ref
    if lr is None:
        raise UsageError(f"cell {cell.name!r} has no lambda_ref; pass --lambda-ref")
    return float(lr)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    return str(v)


# ---------------------------------------------------------------------------------------------
# model-f
# ---------------------------------------------------------------------------------------------
def model_f_report(cell: CellConfig, workload: WorkloadConfig, rate: float, lambda_ref: float) -> dict[str, Any]:
    """Everything `theory model-f` prints, as a dict (also used by prediction freezing)."""
    mom = workload_moments(workload)
    mf, nu_b = model_f_from_cost(cell.cost.model(), mom, cell.kv_pool_tokens, cell.batching)
    lam = rate * lambda_ref
    out: dict[str, Any] = {
        "cell": cell.name,
        "workload": workload.name,
        "rate_multiple": rate,
        "lambda_ref": lambda_ref,
        "E_T": mom.mean_T,
        "E_W": mom.mean_W,
        "E_bar": mom.E_bar,
        "A1": mom.A1,
        "E_E_T": mom.mean_ET,
        "hit_ceiling": mom.hit_ceiling,
        "nu_b": nu_b,
        "decode_share_delta": mf.delta,
        "c1": float(mf.c[0]),
        "cK_over_c1": float(mf.c[-1] / mf.c[0]),
        "lambda_miss_over_lambda_ref": mf.lambda_miss / lambda_ref,
    }
    if mf.rho(lam) > 1.0:
        a = mf.asymptotics(lam)
        out.update(a.summary())
        out["D_over_lambda_ref"] = a.D / lambda_ref
        r = mf.other_root_modulus(lam)
        out["other_root_modulus"] = r
        out["transient_factor_per_generation"] = r / a.z
        nt = mf.near_threshold(a.rho)
        out.update({f"first_order_{k}": v for k, v in nt.items()})
        out["ps_alpha_over_excess"] = mf.ps_backlog_growth(lam) / (lam - mf.lambda_miss)
    else:
        out.update({"lambda": lam, "lambda_miss": mf.lambda_miss, "rho": mf.rho(lam), "trapped": False})
    return out


def _cmd_model_f(args: argparse.Namespace) -> int:
    cell = _load(args.cell, "cells", CellConfig)
    wl = _load(args.workload, "workloads", WorkloadConfig)
    rep = model_f_report(cell, wl, args.rate, _lambda_ref(cell, args.lambda_ref))
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        w = max(len(k) for k in rep)
        for k, v in rep.items():
            print(f"{k:<{w}}  {_fmt(v)}")
    return 0


# ---------------------------------------------------------------------------------------------
# curve
# ---------------------------------------------------------------------------------------------
def curve_report(cell: CellConfig, workload: WorkloadConfig, n_max: int | None = None) -> dict[str, Any]:
    mom = workload_moments(workload)
    cost = cell.cost.model()
    server = Server(cost, mom, cell.batching)
    curve = predicted_curve(server, cell.kv_pool_tokens)
    on = curve.onset
    peak = curve.peak
    n_max = n_max or math.ceil(on.n_b * 1.5)
    ns = np.arange(1, n_max + 1, dtype=float)
    rep: dict[str, Any] = {
        "cell": cell.name,
        "workload": workload.name,
        "pool_tokens": cell.kv_pool_tokens,
        "batching": cell.batching,
        "nu_b": on.nu_b,
        "mu_b": on.mu_b,
        "E_S": on.E_S,
        "n_b": on.n_b,
        "n_b_tool_term": on.tool_term,
        "n_b_pool_term": on.pool_term,
        "crossing_0.5": curve.crossing(0.5),
        "peak_n": peak.n,
        "peak_mu": peak.mu,
        "peak_hit": peak.h,
        "folds": curve.folds,
    }
    if cost.speed != 1.0:
        base = Server(cost.scaled(speed=1.0), mom, cell.batching)

        rep["n_b_speed_law"] = onset_speed_law(all_miss_onset(base, cell.kv_pool_tokens), cost.speed, mom.tool_per_turn)
    if cell.lambda_ref:
        rep["mu_b_over_lambda_ref"] = on.mu_b / cell.lambda_ref
        rep["peak_over_lambda_ref"] = peak.mu / cell.lambda_ref
    rep["table"] = {
        "n": ns.tolist(),
        "mu": [curve.mu_at(float(n)) for n in ns],
        "hit": [curve.hit_at(float(n)) for n in ns],
        "mu_H1": [demand_averaged_mu(curve, mom, float(n)) for n in ns],
    }
    return rep


def _cmd_curve(args: argparse.Namespace) -> int:
    cell = _load(args.cell, "cells", CellConfig)
    wl = _load(args.workload, "workloads", WorkloadConfig)
    rep = curve_report(cell, wl, args.n_max)
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    tab = rep.pop("table")
    w = max(len(k) for k in rep)
    for k, v in rep.items():
        print(f"{k:<{w}}  {_fmt(v)}")
    lr = cell.lambda_ref
    print()
    print(f"{'n':>4} {'mu (1/s)':>10} {'hit':>6} {'mu H1':>10}" + (f" {'mu/lref':>8}" if lr else ""))
    for n, mu, h, m1 in zip(tab["n"], tab["mu"], tab["hit"], tab["mu_H1"]):
        extra = f" {mu / lr:8.3f}" if lr else ""
        print(f"{int(n):4d} {mu:10.5f} {h:6.3f} {m1:10.5f}{extra}")
    return 0


# ---------------------------------------------------------------------------------------------
# fluid
# ---------------------------------------------------------------------------------------------
def _cmd_fluid(args: argparse.Namespace) -> int:
    plan_path = Path(args.plan)
    if not plan_path.is_file():
        raise UsageError(f"plan file {plan_path} not found")
    plan = read_plan(plan_path)
    cell = _load(args.cell, "cells", CellConfig)
    wl = plan.workload
    mom = workload_moments(wl)
    mf, _ = model_f_from_cost(cell.cost.model(), mom, cell.kv_pool_tokens, cell.batching)
    t_end = args.t_end if args.t_end is not None else float(plan.protocol.duration)
    res = plan_fluid_from_plan(mf, plan, t_end=t_end, t_start=args.t_start)
    tr = res.trajectory(args.bin)
    out = Path(args.out) if args.out else plan_path.with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trajectory(tr, out.with_suffix(".fluid.parquet"))
    summary = {
        "plan": str(plan_path),
        "plan_sha256": plan.sha256,
        "cell": cell.name,
        "workload": wl.name,
        "lambda_miss": mf.lambda_miss,
        "t_start": res.t_start,
        "t_end": res.t_end,
        "burst_median_completion": res.burst_median_completion(),
        "sessions": int(res.sessions["arrival"].size),
        "finished": int(np.isfinite(res.sessions["end"]).sum()),
    }
    out.with_suffix(".fluid.json").write_text(json.dumps(summary, indent=2))
    plot_trajectory(
        tr,
        out.with_suffix(".fluid.png"),
        title=f"model F on {plan_path.name} ({cell.name})",
        lambda_ref=plan.lambda_ref,
        wave=summary["burst_median_completion"],
    )
    for k, v in summary.items():
        print(f"{k:<24} {_fmt(v)}")
    print(f"wrote {out.with_suffix('.fluid.parquet')}, .png, .json")
    return 0


def write_trajectory(tr: dict[str, np.ndarray], path: Path) -> None:
    import pandas as pd

    pd.DataFrame(tr).to_parquet(path, index=False)


def plot_trajectory(
    tr: dict[str, np.ndarray], path: Path, *, title: str, lambda_ref: float | None = None, wave: float | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = 0.5 * (tr["t_lo"] + tr["t_hi"])
    fig, ax = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    ax[0].plot(t, tr["backlog"])
    ax[0].set_ylabel("sessions present")
    rate = tr["completion_rate"] / lambda_ref if lambda_ref else tr["completion_rate"]
    ax[1].step(t, rate, where="mid")
    ax[1].set_ylabel("completions / λref" if lambda_ref else "completions (1/s)")
    if wave is not None and math.isfinite(wave):
        ax[1].axvline(wave, ls="--", color="k", lw=0.8)
    ax[2].plot(t, tr["served_prompt"])
    ax[2].set_ylabel("mean served prompt")
    ax[3].plot(t, tr["gap"])
    ax[3].set_ylabel("gap between turns (s)")
    ax[3].set_xlabel("time since start of run (s)")
    ax[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------
def _add_actions(sub: Any) -> None:
    mf = sub.add_parser(
        "model-f",
        help="model F's asymptotic quantities at a load",
        description="Perron root, gap slope, backlog growth, completions, H and Gamma, "
        "tilted mix, near-threshold expansions, for a cell and workload at rate x lambda_ref.",
    )
    mf.add_argument("--cell", required=True, help="cell config (name under configs/cells or a path)")
    mf.add_argument("--workload", default="standard", help="workload config (default: standard)")
    mf.add_argument("--rate", required=True, type=float, help="arrival rate as a multiple of lambda_ref")
    mf.add_argument("--lambda-ref", type=float, default=None, help="override the cell's lambda_ref")
    mf.add_argument("--json", action="store_true", help="print JSON")
    mf.set_defaults(func=_cmd_model_f)

    cv = sub.add_parser(
        "curve",
        help="first-principles mu(n), all-miss onset n_b, 0.5-hit crossing",
        description="The entry model's closed-population curve for a cell (App. E.9).",
    )
    cv.add_argument("--cell", required=True)
    cv.add_argument("--workload", default="standard")
    cv.add_argument("--n-max", type=int, default=None, help="largest population in the table")
    cv.add_argument("--json", action="store_true")
    cv.set_defaults(func=_cmd_curve)

    fl = sub.add_parser(
        "fluid",
        help="model F driven by a frozen plan: per-seed trajectory (Parquet + PNG)",
        description="Run the plan-driven FIFO fluid and write <out>.fluid.parquet, .png, .json.",
    )
    fl.add_argument("--plan", required=True, help="frozen plan file (Parquet)")
    fl.add_argument("--cell", required=True, help="cell whose cost model sets the turn costs")
    fl.add_argument("--out", default=None, help="output stem (default: next to the plan)")
    fl.add_argument("--bin", type=float, default=60.0, help="bin width of the series (s)")
    fl.add_argument("--t-start", type=float, default=None, help="trap start (default: first burst arrival)")
    fl.add_argument("--t-end", type=float, default=None, help="horizon (default: the protocol's duration)")
    fl.set_defaults(func=_cmd_fluid)

    pr = sub.add_parser(
        "predict",
        help="freeze model F's predictions for a test's plans (the file its rule reads)",
        description="Compute the per-run (plan-driven) and per-rate (asymptotic) model F values the test's "
        "rule compares with, for every run of the test, from the plans the runs will play; write them "
        "as a prediction file (JSON) to commit before the runs.",
    )
    pr.add_argument("test", help="test YAML")
    pr.add_argument("--out", required=True, help="prediction file to write (refused if it exists)")
    pr.add_argument("--rule", default=None, help="rule (default: the test's)")
    pr.add_argument(
        "--lambda-ref", type=float, default=None, help="override lambda_ref (default: the test's, else the cell's)"
    )
    pr.set_defaults(func=_cmd_predict)


def _cmd_predict(args: argparse.Namespace) -> int:
    """Freeze model F's predictions for a test (what its rule's `predictions` section asks for)."""
    bundle = load_test(args.test)
    spec = load_rule(args.rule or bundle.test.rule, bundle.test.rule_params)
    lam = args.lambda_ref or (bundle.test.references.lambda_ref if bundle.test.references else None)
    content = freeze_predictions(bundle, spec, lambda_ref=lam)
    out = Path(args.out)
    if out.exists():
        raise UsageError(f"{out} exists: a frozen prediction file is never overwritten")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(content, option=orjson.OPT_INDENT_2))
    print(
        f"{len(content['runs'])} runs and {len(content['rates'])} rates predicted for {bundle.test.name}; wrote {out}"
    )
    return 0


def register(cli: Any) -> None:
    """Add `agentload theory ...`. Accepts the harness CLI object or a plain argparse subparsers action."""
    if hasattr(cli, "command"):
        p = cli.command("theory", group="calibrate", help="model F, the entry model's curve, plan-driven fluid")
    else:
        p = cli.add_parser("theory", help="model F, the entry model's curve, plan-driven fluid")
    p.set_defaults(_parser=p)
    sub = p.add_subparsers(dest="theory_action", metavar="ACTION")
    _add_actions(sub)
