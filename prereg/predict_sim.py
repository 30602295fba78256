"""Predictions from the simulator: the reference engine model in virtual time on fresh seeds.

Per registered run it predicts the probability of each rule state, of STUCK and of the arm's
condition, and the mean of chosen statistics with a tolerance of `tolerance_sd` seed standard
deviations (never below a floor); per seed, the probability that every arm meets its condition
(estimated jointly, since the arms of a seed share a plan); per rate, the rule probability of PASS
from those per-seed probabilities. Optionally (layer "exact") the simulator is also run on the
registered seeds' own frozen plans and its per-run calls are frozen, as the paper's calibrated
simulator did. The seeds are ones the test does not use, so nothing about the registered runs is
seen.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.paired import paired_run
from analysis.rules import arm_expectation
from analysis.staged_analysis import run_quantities
from harness.config import TestBundle
from harness.errors import ConfigError
from harness.recording.schema import RunStatus
from prereg.freeze import utc_precise
from prereg.margin import DEFAULT_MAX_CHANGE, DEFAULT_TOLERANCE
from prereg.outcomes import _INTERVAL, interval_quantities
from prereg.predict_makers import (
    DEFAULT_TOLERANCE_FLOOR,
    DEFAULT_VALUE_QUANTITIES,
    chosen_arms,
    is_registration_file,
    load_bundle,
    predictor,
    registration_ref,
    rule_of,
)
from prereg.predict_margins import noise_for, plan_margins, with_margins
from prereg.predictions import About, Prediction, PredictionFile, make_file
from prereg.scoring import at_least_probability
from provenance.meta import git_state
from runs.arms import execute_run, run_name


def _sim_one(test_path: str, arm: str, rate: float, seed: int, run_dir: str) -> str:
    res = execute_run(load_bundle(test_path), arm, rate, seed, "sim", run_dir)
    if res.status != RunStatus.COMPLETED:
        raise RuntimeError(f"simulated run {arm} r{rate} s{seed} ended {res.status}: {res.reason}")
    return res.run_dir


@dataclass
class _Cell:
    states: list[str]
    stuck: list[bool]
    cond: list[bool]
    values: dict[str, list[float]]


def _simulate(
    test_path: str, runs: list[tuple[str, float, int]], work: Path, jobs: int
) -> dict[tuple[str, float, int], str]:
    dirs = {r: str(work / run_name(*r)) for r in runs}
    if jobs <= 1:
        return {r: _sim_one(test_path, *r, dirs[r]) for r in runs}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futs = {r: pool.submit(_sim_one, test_path, *r, dirs[r]) for r in runs}
        return {r: f.result() for r, f in futs.items()}


@dataclass(frozen=True)
class _Plan:
    """What the predictions are about and how they are made (checked before anything runs)."""

    test_path: str
    bundle: TestBundle
    spec: dict[str, Any]  # the rule the test names (the built-in E2 rule by default), or the registration's
    arm_keys: list[str]
    rates: list[float]
    seeds: list[int]  # the test's own
    fresh: list[int]  # the simulator's, none of the test's
    layers: tuple[str, ...]
    value_quantities: tuple[str, ...]
    floors: dict[str, float]

    @property
    def n_seeds(self) -> int:
        return len(self.fresh)


def _plan(
    test_path: str | Path,
    n_seeds: int,
    first_seed: int,
    arms: Sequence[str] | None,
    rates: Sequence[float] | None,
    layers: Sequence[str],
    value_quantities: Sequence[str],
    tolerance_floor: Mapping[str, float] | None,
) -> _Plan:
    bundle = load_bundle(test_path)
    path = str(bundle.path or test_path)
    seeds = list(bundle.test.seeds)
    fresh = list(range(first_seed, first_seed + n_seeds))
    if set(fresh) & set(seeds):
        raise ConfigError(f"fresh seeds {fresh} overlap the test's seeds {seeds}; choose --first-seed outside them")
    if n_seeds < 1:
        raise ConfigError(f"--seeds {n_seeds}: at least one fresh seed is needed")
    bad = set(layers) - {"fresh", "exact"}
    if bad:
        raise ConfigError(f"layers {sorted(bad)}: expected 'fresh' and/or 'exact'")
    return _Plan(
        path,
        bundle,
        rule_of(path, bundle),
        chosen_arms(bundle, arms),
        [float(r) for r in (rates or bundle.test.rates)],
        seeds,
        fresh,
        tuple(layers),
        tuple(value_quantities),
        {**DEFAULT_TOLERANCE_FLOOR, **(tolerance_floor or {})},
    )


def _judged_runs(plan: _Plan, work_dir: str | Path | None, jobs: int) -> dict[tuple[str, float, int], Any]:
    """Simulate every fresh (and, for the exact layer, registered) run and judge it by the rule."""
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="agentload-sim-pred-")
        work = Path(tmp.name)
    else:
        work = Path(work_dir)
    try:
        todo = [(a, r, s) for a in plan.arm_keys for r in plan.rates for s in plan.fresh]
        if "exact" in plan.layers:
            todo += [(a, r, s) for a in plan.arm_keys for r in plan.rates for s in plan.seeds]
        dirs = _simulate(plan.test_path, todo, work, jobs)
        # each run as the paired verdict lists it (state, good, flags, stats): the one judging path
        verdicts = {k: paired_run(plan.spec, run_quantities(d, plan.spec, series=False).run) for k, d in dirs.items()}
        extra = {q for q in plan.value_quantities if _INTERVAL.match(q)}
        if extra:
            bin_s = float(plan.spec["params"]["backlog_bin"])
            for k, d in dirs.items():
                verdicts[k]["stats"].update(interval_quantities(Path(d), extra, bin_s))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return verdicts


def _value_prediction(
    q: str, xs: list[float], tag: str, about: About, src: dict[str, Any], tolerance_sd: float, floor: float, band: bool
) -> Prediction | None:
    """A statistic's mean over the fresh seeds with its tolerance (None when no seed gave it)."""
    arr = np.array([x for x in xs if math.isfinite(x)])
    if arr.size == 0:
        return None
    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    tolerance: dict[str, Any]
    if band:
        tolerance = {"interval": [round(float(arr.min()), 6), round(float(arr.max()), 6)]}
        how = f"the band of {arr.size} fresh seeds"
    else:
        tolerance = {"abs": round(max(tolerance_sd * sd, floor), 6)}
        how = f"max({tolerance_sd:g} sd, floor {floor:g})"
    return Prediction(
        f"sim-{tag}-{q}",
        q,
        about,
        "value",
        {**src, "seed_values": [round(float(x), 6) for x in arr]},
        {"value": round(float(arr.mean()), 6), "tolerance": tolerance},
        "simulator fresh values",
        note=f"mean of {arr.size} fresh seeds; tolerance {how}",
    )


def _run_predictions(
    plan: _Plan, c: _Cell, a: str, r: float, src_base: dict[str, Any], tolerance_sd: float, band: bool
) -> list[Prediction]:
    """Per registered run of arm `a` at rate `r`: state, STUCK, the arm's condition, the values."""
    n = plan.n_seeds
    src = {
        **src_base,
        "layer": "fresh seeds",
        "seeds": plan.fresh,
        "n_seeds": n,
        "states": {k: c.states.count(k) for k in sorted(set(c.states))},
    }
    state_names = [s["name"] for s in plan.spec["states"]]
    out: list[Prediction] = []
    for seed in plan.seeds:
        about = About("run", a, r, seed)
        tag = f"{a}-r{r:.2f}-s{seed}"
        probs = {k: c.states.count(k) / n for k in state_names}
        out.append(
            Prediction(
                f"sim-{tag}-state", "state", about, "categorical", src, {"probabilities": probs}, "simulator fresh"
            )
        )
        out.append(
            Prediction(
                f"sim-{tag}-stuck",
                "stuck",
                about,
                "probability",
                src,
                {"event": {"equals": True}, "probability": sum(c.stuck) / n},
                "simulator fresh",
            )
        )
        out.append(
            Prediction(
                f"sim-{tag}-condition",
                "arm_condition",
                about,
                "probability",
                src,
                {"event": {"equals": True}, "probability": sum(c.cond) / n},
                "simulator fresh",
                note=f"the {a} arm's registered condition ({', '.join(_expect(plan.spec, a))})",
            )
        )
        for q, xs in c.values.items():
            v = _value_prediction(q, xs, tag, about, src, tolerance_sd, float(plan.floors.get(q, 0.0)), band)
            if v is not None:
                out.append(v)
    return out


def _seed_and_rate_predictions(plan: _Plan, r: float, joint: list[bool], src_base: dict[str, Any]) -> list[Prediction]:
    """Per registered seed, every arm good (jointly estimated); per rate, the rule's PASS probability."""
    n = plan.n_seeds
    p_seed = sum(joint) / n
    out: list[Prediction] = []
    leaves = []
    for seed in plan.seeds:
        pid = f"sim-r{r:.2f}-s{seed}-seed-good"
        leaves.append(pid)
        out.append(
            Prediction(
                pid,
                "seed_good",
                About("seed", rate=r, seed=seed),
                "probability",
                {**src_base, "layer": "fresh seeds", "seeds": plan.fresh, "n_seeds": n, "joint": joint},
                {"event": {"equals": True}, "probability": p_seed},
                "simulator fresh",
                note="every arm meets its condition in this seed (estimated jointly over fresh seeds)",
            )
        )
    need = int(plan.spec["params"]["min_good_seeds"])
    out.append(
        Prediction(
            f"sim-r{r:.2f}-pass",
            "verdict_pass",
            About("rate", rate=r),
            "rule_probability",
            {**src_base, "layer": "fresh seeds", "rule": plan.spec["name"]},
            {
                "rule": {"at_least": need, "of": [{"prediction": x, "is": True} for x in leaves]},
                "probability": round(at_least_probability([p_seed] * len(leaves), need), 6),
            },
            "simulator rule",
            note=f"rate passes: >= {need} of {len(leaves)} seeds good (independent seeds)",
        )
    )
    return out


def _exact_predictions(
    plan: _Plan, r: float, verdicts: Mapping[Any, Any], src_base: dict[str, Any]
) -> list[Prediction]:
    """The simulator's own calls on the registered seeds' frozen plans (the exact layer)."""
    out: list[Prediction] = []
    for a in plan.arm_keys:
        for seed in plan.seeds:
            v = verdicts[(a, r, seed)]
            about = About("run", a, r, seed)
            tag = f"{a}-r{r:.2f}-s{seed}"
            src = {**src_base, "layer": "exact plan", "seeds": [seed]}
            out.append(
                Prediction(
                    f"simx-{tag}-state", "state", about, "call", src, {"value": v["state"]}, "simulator exact plan"
                )
            )
            out.append(
                Prediction(
                    f"simx-{tag}-stuck",
                    "stuck",
                    about,
                    "call",
                    src,
                    {"value": bool(v["flags"].get("stuck"))},
                    "simulator exact plan",
                )
            )
    return out


def simulator_predictions(
    test_path: str | Path,
    *,
    n_seeds: int = 3,
    first_seed: int = 1000,
    arms: Sequence[str] | None = None,
    rates: Sequence[float] | None = None,
    layers: Sequence[str] = ("fresh",),
    value_quantities: Sequence[str] = DEFAULT_VALUE_QUANTITIES,
    tolerance_sd: float = 2.0,
    tolerance_floor: Mapping[str, float] | None = None,
    band: bool = False,
    registration: str | Path | None = None,
    work_dir: str | Path | None = None,
    jobs: int = 1,
    name: str | None = None,
    margins: bool = True,
    margin_tolerance: float = DEFAULT_TOLERANCE,
    margin_max_change: float = DEFAULT_MAX_CHANGE,
    e0a: str | Path | None = None,
) -> PredictionFile:
    """Predictions from the simulator for every registered run of a test (see the module doc).

    band: a value's tolerance is the band the fresh seeds spanned, [min, max] (the paper's
    "inside its 20-seed band" for release times), instead of mean +- tolerance_sd sd.
    margins: every prediction carries its flip margins (prereg/predict_margins.py), found by
    bisection to `margin_tolerance` up to `margin_max_change`, and its knife-edge label against
    E0a's seed spread (`e0a`, else the E0a input the registration binds)."""
    if registration is None and is_registration_file(test_path):
        registration = test_path  # predictions about a registered test are bound to it
    if margins and not 0 < margin_tolerance < margin_max_change < 1:
        raise ConfigError(
            f"margin tolerance {margin_tolerance:g} and largest change {margin_max_change:g}: expected "
            "0 < tolerance < largest change < 1 (relative changes)"
        )
    plan = _plan(test_path, n_seeds, first_seed, arms, rates, layers, value_quantities, tolerance_floor)
    noise = noise_for(plan.test_path, registration, e0a) if margins else None  # a bad E0a fails before any run
    verdicts = _judged_runs(plan, work_dir, jobs)
    bundle, fresh = plan.bundle, plan.fresh
    commit = git_state()
    src_base = {
        "kind": "simulator",
        "engine": "harness.refengine.model.EngineModel (virtual time)",
        "engine_commit": commit["commit"],
        "dirty": commit["dirty"],
        "cell": bundle.cell.name,
    }
    preds: list[Prediction] = []
    for r in plan.rates:
        joint = [all(verdicts[(a, r, s)]["good"] for a in plan.arm_keys) for s in fresh]
        for a in plan.arm_keys:
            vs = [verdicts[(a, r, s)] for s in fresh]
            c = _Cell(
                [v["state"] for v in vs],
                [bool(v["flags"].get("stuck")) for v in vs],
                [v["good"] for v in vs],
                {q: [_or_nan(v["stats"].get(q)) for v in vs] for q in plan.value_quantities},
            )
            preds += _run_predictions(plan, c, a, r, src_base, tolerance_sd, band)
        preds += _seed_and_rate_predictions(plan, r, joint, src_base)
        if "exact" in plan.layers:
            preds += _exact_predictions(plan, r, verdicts, src_base)
    margin_block = None
    if margins:
        pm = plan_margins(
            bundle,
            plan.spec,
            plan.arm_keys,
            plan.rates,
            fresh,
            plan.seeds if "exact" in plan.layers else [],
            verdicts,
            noise=noise,
            tol=margin_tolerance,
            max_change=margin_max_change,
            jobs=jobs,
        )
        preds = with_margins(preds, pm, noise, margin_max_change)
        margin_block = {
            "tolerance": margin_tolerance,
            "max_change": margin_max_change,
            "knobs": {
                "speed": "the cost's speed (the all-miss token reference moves with it)",
                "lambda_ref": "the registered lambda_ref (arrival rates and the rule's references move with it)",
            },
            "noise": noise,
            "simulated_runs": pm.simulated,
            "reused": "the predictions' own runs at factor 1",
        }
    see = [
        f"the test config {plan.test_path} and the configs it names (cell {bundle.cell.name}, workload "
        f"{bundle.workload.name})",
        f"simulated runs on fresh seeds {fresh}, which the test does not use",
    ]
    if "exact" in plan.layers:
        see.append(
            f"simulated runs on the registered seeds' own frozen plans (seeds {plan.seeds}): the plans, not any engine "
            "run"
        )
    if margins:
        see.append(
            "for the flip margins, the same seeds simulated with the cost's speed and lambda_ref moved, and E0a's "
            "per-seed rows (the noise)" + ("" if noise else ": no E0a was bound, so no knife-edge label")
        )
    see.append("no run of this test on the engine under test")
    params = {
        "n_seeds": n_seeds,
        "first_seed": first_seed,
        "layers": list(layers),
        "value_quantities": list(value_quantities),
        "tolerance_sd": tolerance_sd,
        "tolerance_floor": plan.floors,
        "band": band,
        "rule": plan.spec["name"],
    }
    if margins:
        params["margin_tolerance"] = margin_tolerance
        params["margin_max_change"] = margin_max_change
    return make_file(
        name or f"{bundle.test.name}-simulator",
        preds,
        test=bundle.test.name,
        registration=registration_ref(registration),
        predictor=predictor("simulator", params),
        could_see=see,
        made_at=utc_precise(),
        description=f"Simulator predictions for test {bundle.test.name}: {n_seeds} fresh seeds per arm and rate",
        scoring_declaration="Probabilities call the side above one half; categorical predictions call their modal "
        "state; values hit inside their stated tolerance; the rate's PASS probability assumes independent seeds."
        + (" Robust and knife-edge predictions (margin.label) are also scored apart." if margins else ""),
        margins=margin_block,
    )


def _expect(spec: Mapping[str, Any], arm: str) -> list[str]:
    return arm_expectation(spec, arm)


def _or_nan(v: Any) -> float:
    """A statistic as the paired verdict lists it (None for a non-finite value) as a number."""
    return math.nan if v is None else float(v)
