"""Predictions from the theory, made before any run: model F on each registered seed's exact frozen
plan (`model_f_predictions`), and the first-principles entry model's closed-population curve
(`entry_predictions`). prereg/predict_makers.py's docstring says what each predicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis.theory.entry import Server, all_miss_onset, predicted_curve
from analysis.theory.fluid import plan_fluid_from_plan
from analysis.theory.model_f import model_f_from_cost
from analysis.theory.moments import workload_moments
from harness.config import CellConfig, WorkloadConfig, load_config
from harness.errors import ConfigError
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan
from prereg.freeze import utc_precise
from prereg.predict_makers import chosen_arms, is_registration_file, load_bundle, predictor, registration_ref
from prereg.predictions import About, Prediction, PredictionFile, make_file
from provenance.meta import git_state, sha256_bytes
from runs.arms import references


def model_f_predictions(
    test_path: str | Path,
    *,
    arms: Sequence[str] | None = None,
    rates: Sequence[float] | None = None,
    slope_tolerance: float = 0.004,
    completions_tolerance: float = 0.006,
    backlog_tolerance_rel: float = 0.15,
    intervals: Sequence[tuple[float, float]] = (),
    wave: bool = False,
    wave_tolerance: float = 0.15,
    trap_state: bool = False,
    registration: str | Path | None = None,
    name: str | None = None,
) -> PredictionFile:
    """Per-seed model F predictions from each registered seed's exact frozen plan (burst arms only).

    intervals  extra [a, b) intervals: slope_a_b and completions_a_b (CUT's [3000, 8700), MIRROR's
               late completions over [6600, 8700), ...), with the slope and completions tolerances
    wave       the burst cohort's median completion ("wave"), within wave_tolerance (F - t_burst)
               (MIRROR's M2: 0.15)
    trap_state the asymptotic trap-state targets at the run's nominal rate, per run: the tilted-mix
               mean prompt of turns completed in the window (S1, +-8%), completions D (S3, +-15%),
               backlog growth alpha (S4, +-35%)
    """
    bundle = load_bundle(test_path)
    if registration is None and is_registration_file(test_path):
        registration = test_path  # predictions about a registered test are bound to it
    refs = references(bundle)
    lam_ref = refs["lambda_ref"]
    cell = bundle.cell
    proto = bundle.protocol
    w0, w1 = float(proto.window.start), float(proto.window.end)
    arm_keys = [a for a in chosen_arms(bundle, arms) if bundle.arms[a].burst]
    if not arm_keys:
        raise ConfigError(
            f"test {bundle.test.name}: model F predicts a trap entered at a burst; no burst arm among "
            f"{list(bundle.arms)}"
        )
    mom = workload_moments(bundle.workload)
    mf, _ = model_f_from_cost(cell.cost.model(), mom, cell.kv_pool_tokens, cell.batching)
    onset = all_miss_onset(Server(cell.cost.model(), mom, cell.batching), cell.kv_pool_tokens)
    src_base = {
        "kind": "model_f",
        "model": "analysis.theory.fluid.plan_fluid (FIFO, every turn missing)",
        "code_commit": git_state()["commit"],
        "lambda_miss_model": mf.lambda_miss,
        "onset_n_b": onset.n_b,
    }
    preds: list[Prediction] = []
    for a in arm_keys:
        for r in [float(x) for x in (rates or bundle.test.rates)]:
            for seed in bundle.test.seeds:
                plan = make_plan(bundle.workload, proto, bundle.arms[a], r, lam_ref, seed)
                psha = sha256_bytes(plan_bytes(plan))
                res = plan_fluid_from_plan(mf, plan, t_end=float(proto.duration))
                tr = res.trajectory(float(proto.backlog_bin))
                m = (tr["t_lo"] >= w0) & (tr["t_hi"] <= w1)
                slope = res.backlog_slope(w0, w1, float(proto.backlog_bin))
                arr = np.array([s.arrival for s in plan.sessions if s.kind == "base" and not s.refused])
                lam_plan = float(np.sum((arr >= w0) & (arr < w1))) / (w1 - w0)
                qs = lam_plan - lam_ref
                end = res.sessions["end"]
                present_end = int(np.sum((res.sessions["arrival"] <= proto.duration) & (end > proto.duration - 1e-9)))
                stuck = bool(np.min(tr["backlog"][m]) > onset.n_b) if np.any(m) else False
                about = About("run", a, r, seed)
                tag = f"{a}-r{r:.2f}-s{seed}"
                src = {**src_base, "plan_sha256": psha, "seed": seed}
                for a0, b0 in intervals:
                    q = f"{a0:g}_{b0:g}"
                    preds.append(
                        Prediction(
                            f"mf-{tag}-slope-{q}",
                            f"slope_{q}",
                            about,
                            "value",
                            src,
                            {
                                "value": round(res.backlog_slope(float(a0), float(b0), float(proto.backlog_bin)), 6),
                                "tolerance": {"abs": slope_tolerance},
                            },
                            "model F intervals",
                        )
                    )
                    preds.append(
                        Prediction(
                            f"mf-{tag}-completions-{q}",
                            f"completions_{q}",
                            about,
                            "value",
                            src,
                            {
                                "value": round(res.completion_rate(float(a0), float(b0)), 6),
                                "tolerance": {"abs": completions_tolerance},
                            },
                            "model F intervals",
                        )
                    )
                if wave:
                    wv = res.burst_median_completion()
                    if math.isfinite(wv):
                        preds.append(
                            Prediction(
                                f"mf-{tag}-wave",
                                "wave",
                                about,
                                "value",
                                src,
                                {
                                    "value": round(wv, 3),
                                    "tolerance": {"rel_of_offset": wave_tolerance, "origin": float(proto.burst.time)},
                                },
                                "model F wave",
                                note="median completion time of the burst cohort",
                            )
                        )
                if trap_state and mf.rho(r * lam_ref) > 1.0:
                    asy = mf.asymptotics(r * lam_ref)
                    w = f"{w0:g}_{w1:g}"
                    ts = {**src, "asymptotic": True, "rate": r}
                    targets = (
                        (
                            "S1",
                            f"mean_prompt_{w}",
                            round(asy.tilted_prompt, 3),
                            0.08,
                            "S1: tilted-mix mean prompt of the turns completed in the window",
                        ),
                        (
                            "S3",
                            "sessions_completed_rate",
                            round(asy.D, 6),
                            0.15,
                            "S3: completions D (the pooled tolerance, applied per run)",
                        ),
                        (
                            "S4",
                            "slope",
                            round(asy.alpha, 6),
                            0.35,
                            "S4: backlog growth alpha (the pooled tolerance, applied per run)",
                        ),
                    )
                    preds += [
                        Prediction(
                            f"mf-{tag}-{sid}",
                            quantity,
                            about,
                            "value",
                            ts,
                            {"value": value, "tolerance": {"rel": rel}},
                            "model F trap state",
                            note=note,
                        )
                        for sid, quantity, value, rel, note in targets
                    ]
                preds += [
                    Prediction(
                        f"mf-{tag}-slope",
                        "slope",
                        about,
                        "value",
                        src,
                        {"value": round(slope, 6), "tolerance": {"abs": slope_tolerance}},
                        "model F",
                    ),
                    Prediction(
                        f"mf-{tag}-slope-vs-qs",
                        "slope",
                        about,
                        "closest",
                        src,
                        {"value": round(slope, 6), "comparators": {"quasi_static": round(qs, 6)}},
                        "model F vs quasi-static",
                        note="quasi-static comparator: the plan's window arrival rate minus lambda_miss (= lambda_ref)",
                    ),
                    Prediction(
                        f"mf-{tag}-completions",
                        "sessions_completed_rate",
                        about,
                        "value",
                        src,
                        {"value": round(res.completion_rate(w0, w1), 6), "tolerance": {"abs": completions_tolerance}},
                        "model F",
                    ),
                    Prediction(
                        f"mf-{tag}-backlog-end",
                        "backlog_end",
                        about,
                        "value",
                        src,
                        {"value": present_end, "tolerance": {"rel": backlog_tolerance_rel}},
                        "model F",
                    ),
                    Prediction(
                        f"mf-{tag}-stuck",
                        "stuck",
                        about,
                        "call",
                        src,
                        {"value": stuck},
                        "model F",
                        note=f"stuck iff the fluid backlog stays above the all-miss onset n_b = {onset.n_b:.1f} over "
                        "the window",
                    ),
                ]
    params = {
        "slope_tolerance": slope_tolerance,
        "completions_tolerance": completions_tolerance,
        "backlog_tolerance_rel": backlog_tolerance_rel,
        "intervals": [list(x) for x in intervals],
        "wave": wave,
        "wave_tolerance": wave_tolerance,
        "trap_state": trap_state,
    }
    return make_file(
        name or f"{bundle.test.name}-model-f",
        preds,
        test=bundle.test.name,
        registration=registration_ref(registration),
        predictor=predictor("model_f", params),
        made_at=utc_precise(),
        could_see=[
            f"the test config and the frozen plans of seeds {list(bundle.test.seeds)} (generated from the configs)",
            f"the cell's cost model ({cell.cost_file}); no run of any kind",
        ],
        description=f"Model F driven by each seed's exact plan for test {bundle.test.name}",
    )


# ---------------------------------------------------------------------------------------------
# the first-principles entry model
# ---------------------------------------------------------------------------------------------
def entry_predictions(
    cell_ref: str,
    workload_ref: str = "standard",
    *,
    grid: Sequence[int] = (16, 20, 24, 32, 48, 96, 300),
    mu_tolerance_rel: float = 0.10,
    crossing_tolerance: float = 3.0,
    onset_tolerance: float = 3.0,
    ratio_tolerance_rel: float = 0.10,
    name: str | None = None,
) -> PredictionFile:
    """The entry model's closed-population curve for a cell, to be scored against its Stage C."""
    cell = load_config(cell_ref if cell_ref.endswith((".yaml", ".yml")) else f"cells/{cell_ref}", CellConfig)
    wl = load_config(
        workload_ref if workload_ref.endswith((".yaml", ".yml")) else f"workloads/{workload_ref}", WorkloadConfig
    )
    mom = workload_moments(wl)
    curve = predicted_curve(Server(cell.cost.model(), mom, cell.batching), cell.kv_pool_tokens)
    target = f"stage-c:{cell.name}"
    src = {
        "kind": "entry_model",
        "model": "analysis.theory.entry.predicted_curve (App. E.9)",
        "code_commit": git_state()["commit"],
        "cell": cell.name,
        "workload": wl.name,
    }
    lay = "entry model"
    preds = [
        Prediction(
            f"entry-{cell.name}-mu-n{n}",
            "mu",
            About("measurement", target=f"{target}:n={n}"),
            "value",
            src,
            {"value": round(curve.mu_at(float(n)), 6), "tolerance": {"rel": mu_tolerance_rel}},
            lay,
            note="completed sessions/s at closed population n",
        )
        for n in grid
    ]
    about = About("measurement", target=target)
    preds.append(
        Prediction(
            f"entry-{cell.name}-crossing",
            "crossing_0.5",
            about,
            "value",
            src,
            {"value": round(curve.crossing(0.5), 3), "tolerance": {"abs": crossing_tolerance}},
            lay,
        )
    )
    preds.append(
        Prediction(
            f"entry-{cell.name}-onset",
            "onset_n_b",
            about,
            "value",
            src,
            {"value": round(curve.onset.n_b, 3), "tolerance": {"abs": onset_tolerance}},
            lay,
            note="all-miss onset: the population from which the follow-up hit fraction is zero",
        )
    )
    if cell.lambda_ref:
        preds.append(
            Prediction(
                f"entry-{cell.name}-peak-ratio",
                "peak_ratio",
                about,
                "value",
                src,
                {"value": round(curve.peak.mu / cell.lambda_ref, 4), "tolerance": {"rel": ratio_tolerance_rel}},
                lay,
                note="mu*/lambda_ref: the window's upper end as the curve sets it (the registered edge is min(this, "
                "E0b edge))",
            )
        )
        preds.append(
            Prediction(
                f"entry-{cell.name}-all-miss-ratio",
                "all_miss_ratio",
                about,
                "value",
                src,
                {"value": round(curve.onset.mu_b / cell.lambda_ref, 4), "tolerance": {"rel": ratio_tolerance_rel}},
                lay,
                note="mu_b/lambda_ref: the model's lambda_miss, the window's lower end",
            )
        )
    params = {
        "grid": list(grid),
        "mu_tolerance_rel": mu_tolerance_rel,
        "crossing_tolerance": crossing_tolerance,
        "onset_tolerance": onset_tolerance,
        "ratio_tolerance_rel": ratio_tolerance_rel,
    }
    return make_file(
        name or f"{cell.name}-entry-model",
        preds,
        test=None,
        registration=None,
        predictor=predictor("entry_model", params),
        made_at=utc_precise(),
        could_see=[f"the cell config {cell.name} and its cost model; the workload {wl.name}; no run"],
        description=f"First-principles entry model for cell {cell.name}",
    )
