"""Freeze model F's predictions for a test before its runs: the prediction file a rule reads.

The rule spec says what it compares with (its `predictions` section); this module computes those
values from the cell's cost model and each run's exact frozen plan, the way the paper froze its
per-seed model F predictions (CUT slopes, MIRROR waves and slopes) and its asymptotic trap-state
quantities (S1-S5), and writes them with the plan hashes they were computed for. The verdict then
reads the file; nothing in the verdict recomputes a prediction.

    predictions:
      model: model_f
      arms: [cut-a115]            # arms with per-run (plan-driven) values
      t_start: burst              # the trap starts at the first burst arrival | toolslow | a number
      runs:
        slope: {metric: backlog_slope, start: 3000, end: duration}
        wave: {metric: wave}
      asymptotic: true            # z, gamma, alpha, D, tilted prompt at each nominal rate
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np

from analysis.expr import Evaluator
from analysis.predictions import FORMAT
from analysis.theory.fluid import PlanFluidResult, plan_fluid_from_plan
from analysis.theory.model_f import ModelF, model_f_from_cost
from analysis.theory.moments import workload_moments
from harness.config import TestBundle
from harness.errors import RuleError
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan

NAN = float("nan")


def _arrivals(plan: Any, start: float, end: float) -> float:
    n = sum(1 for s in plan.sessions if s.kind == "base" and start <= s.arrival < end)
    return n / (end - start)


def _fluid_value(
    metric: str, res: PlanFluidResult, plan: Any, mf: ModelF, lambda_ref: float, args: Mapping[str, Any]
) -> float:
    a, b = args.get("start"), args.get("end")
    if a is not None and b is not None and not float(b) - float(a) >= 2 * float(args.get("width", 10.0)):
        return NAN  # a window this protocol does not have: no prediction rather than a made-up one

    def window() -> tuple[float, float]:
        """The metric's [start, end), which a windowed metric cannot do without."""
        if a is None or b is None:
            raise RuleError(f"predictions: metric {metric!r}: expected start and end, got start {a!r}, end {b!r}")
        return float(a), float(b)

    if metric == "backlog_slope":
        return res.backlog_slope(*window(), float(args.get("width", 10.0)))
    if metric == "completions":
        x = res.completion_rate(*window())
        return x / lambda_ref if args.get("unit", "lambda_ref") == "lambda_ref" else x
    if metric == "wave":
        return res.burst_median_completion()
    if metric == "mean_prompt":
        start, end = window()
        d = res.requests["done"]
        m = (d >= start) & (d < end)
        return float(np.mean(res.requests["prompt"][m])) if m.any() else NAN
    if metric == "backlog_at":
        t = float(args["at"])
        arr, ends = res.sessions["arrival"], res.sessions["end"]
        return float(np.sum((arr <= t) & (ends > t)))
    if metric == "qs_slope":
        return _arrivals(plan, *window()) - mf.lambda_miss
    if metric == "plan_arrival_rate":
        return _arrivals(plan, *window())
    raise RuleError(
        f"predictions: unknown metric {metric!r} (backlog_slope, completions, wave, mean_prompt, backlog_at, qs_slope, "
        "plan_arrival_rate)"
    )


def _t_start(how: Any, arm: Any, protocol: Any) -> float | None:
    if how in (None, "burst"):
        return None  # plan_fluid: the first burst arrival
    if how == "toolslow":
        if arm.toolslow is None:
            raise RuleError(f"predictions: t_start 'toolslow' but arm {arm.name!r} has no toolslow")
        return float(arm.toolslow.start)
    return float(how)


def freeze_predictions(
    bundle: TestBundle, spec: Mapping[str, Any], *, lambda_ref: float | None = None
) -> dict[str, Any]:
    """The prediction file's content for every (arm, rate, seed) of the test the spec predicts."""
    ps = spec.get("predictions")
    if not ps:
        raise RuleError(f"rule {spec.get('name')!r} has no predictions section: nothing to freeze")
    if ps.get("model", "model_f") != "model_f":
        raise RuleError(f"predictions: model {ps.get('model')!r}; only 'model_f' is implemented")
    ref = lambda_ref if lambda_ref is not None else bundle.cell.lambda_ref
    if ref is None:
        raise RuleError(
            f"predictions: cell {bundle.cell.name}: lambda_ref: got null; expected the cell's E0a lambda_ref "
            "or a lambda_ref given to the freeze"
        )
    lam_ref = float(ref)
    mom = workload_moments(bundle.workload)
    mf, _ = model_f_from_cost(bundle.cell.cost.model(), mom, bundle.cell.kv_pool_tokens, bundle.cell.batching)
    duration = float(bundle.protocol.duration)
    ev = Evaluator(
        {
            **spec["params"],
            "duration": duration,
            "window_start": bundle.protocol.window.start,
            "window_end": bundle.protocol.window.end,
            "burst_time": bundle.protocol.burst.time,
        }
    )
    rates_out = []
    if ps.get("asymptotic", False):
        for r in bundle.test.rates:
            lam = float(r) * lam_ref
            vals: dict[str, Any] = {"lambda_miss_model": mf.lambda_miss, "rho": mf.rho(lam)}
            if mf.rho(lam) > 1.0:
                a = mf.asymptotics(lam)
                vals.update(
                    {
                        "z": a.z,
                        "gamma": a.gamma,
                        "gamma_over_z": a.gap_slope_completion,
                        "alpha": a.alpha,
                        "D": a.D,
                        "tilted_prompt": a.tilted_prompt,
                        "stationary_prompt": a.stationary_prompt,
                    }
                )
            rates_out.append({"rate": float(r), "values": vals})
    runs_out = []
    want = [a.lower() for a in ps.get("arms", [])]
    for key, arm in bundle.arms.items():
        if key.lower() not in want and arm.name.lower() not in want:
            continue
        for r in bundle.test.rates:
            for seed in bundle.test.seeds:
                plan = make_plan(bundle.workload, bundle.protocol, arm, float(r), lam_ref, int(seed))
                sha = hashlib.sha256(plan_bytes(plan)).hexdigest()
                res = plan_fluid_from_plan(
                    mf, plan, t_end=duration, t_start=_t_start(ps.get("t_start"), arm, bundle.protocol)
                )
                vals = {}
                for name, m in (ps.get("runs") or {}).items():
                    args = {
                        k: (ev(v) if isinstance(v, str) and k not in ("unit",) else v)
                        for k, v in m.items()
                        if k != "metric"
                    }
                    vals[name] = _fluid_value(m["metric"], res, plan, mf, lam_ref, args)
                tr = res.trajectory(float(ps.get("trajectory_bin", 60.0)))
                runs_out.append(
                    {
                        "arm": arm.name,
                        "rate": float(r),
                        "seed": int(seed),
                        "plan_sha256": sha,
                        "values": {
                            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in vals.items()
                        },
                        "trajectory": {
                            "t": (0.5 * (tr["t_lo"] + tr["t_hi"])).round(3).tolist(),
                            "backlog": tr["backlog"].round(4).tolist(),
                            "completions": (tr["completion_rate"] / lam_ref).round(5).tolist(),
                        },
                    }
                )
    return {
        "format": FORMAT,
        "format_version": 1,
        "name": f"{bundle.test.name}-{spec['name']}",
        "model": (
            "model F: plan-driven FIFO fluid on each run's exact plan, every turn missing; asymptotics at the "
            "nominal rates"
        ),
        "rule": spec["name"],
        "test": bundle.test.name,
        "cell": bundle.cell.name,
        "workload": bundle.workload.name,
        "lambda_ref": lam_ref,
        "lambda_miss_model": mf.lambda_miss,
        "frozen_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "rates": rates_out,
        "runs": runs_out,
    }
