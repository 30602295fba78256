"""Makers of prediction files, one per kind of predictor the paper froze.

- `simulator_predictions`: the reference engine model in virtual time, run on N fresh seeds (seeds
  the test does not use, so nothing about the registered runs is seen). Per registered run it
  predicts the probability of each rule state, of STUCK and of the arm's condition, and the mean of
  chosen statistics with a tolerance of `tolerance_sd` seed standard deviations (never below a
  floor); per seed, the probability that every arm meets its condition (estimated jointly, since
  the arms of a seed share a plan); per rate, the rule probability of PASS from those per-seed
  probabilities. Optionally (layer "exact") the simulator is also run on the registered seeds' own
  frozen plans and its per-run calls are frozen, as the paper's calibrated simulator did.
- `model_f_predictions`: model F driven by each registered seed's exact frozen plan (the
  plan-driven FIFO fluid): backlog slope over the window (and the quasi-static λ_plan − λ_miss as a
  comparator), completions, sessions present at the end, and a stuck call by the onset criterion.
- `entry_predictions`: the first-principles entry model: μ(n) on a grid, the 0.5-hit crossing,
  the all-miss onset n_b, the peak ratio μ*/λ_ref (the window's upper end from the curve's side)
  and μ_b/λ_ref (its lower end).

Every tolerance is a named parameter with the paper's value as its default where the paper states
one (crossing ±3 sessions, completions 0.006 /s); the file records which parameters were used.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from analysis.report import analyze_run
from analysis.rules import arm_expectation, load_rule
from analysis.theory.entry import Server, all_miss_onset, predicted_curve
from analysis.theory.fluid import plan_fluid_from_plan
from analysis.theory.model_f import model_f_from_cost
from analysis.theory.moments import workload_moments
from harness.config import CellConfig, TestBundle, WorkloadConfig, load_config, load_test
from harness.errors import ConfigError
from harness.recording.schema import RunStatus
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan
from prereg.freeze import utc_precise
from prereg.outcomes import _INTERVAL, interval_quantities
from prereg.predictions import About, Prediction, PredictionFile, make_file
from prereg.registration import load_registration
from prereg.scoring import at_least_probability
from provenance.meta import git_state, sha256_bytes, sha256_file
from runs.arms import execute_run, find_arm, references, run_name

DEFAULT_VALUE_QUANTITIES = ("hit", "followup_hit", "slope", "token_ratio")
# Floors under the seed-spread tolerance, per quantity (units of the quantity).
DEFAULT_TOLERANCE_FLOOR = {
    "hit": 0.01,
    "followup_hit": 0.01,
    "slope": 0.002,
    "token_ratio": 0.03,
    "completions_ref": 0.05,
    "backlog_end": 5.0,
}


def is_registration_file(path: str | Path) -> bool:
    """Does `path` hold a registration (format agentload-registration) rather than a test config?"""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        doc = yaml.safe_load(p.read_bytes())
    except yaml.YAMLError:
        return False
    return isinstance(doc, dict) and doc.get("format") == "agentload-registration"


def load_bundle(path: str | Path) -> TestBundle:
    """The test the predictions are about: a test config, or a registration file read as its
    registered test (`Registration.bundle()`: the registered cell with the references the
    calibration gave, the registered arms, rates and seeds). Predictions made after a fill are
    about the registered rates and plans, which a test config written before calibration cannot
    name."""
    if is_registration_file(path):
        return load_registration(path).bundle()
    return load_test(path)


def _rule_of(test_path: str | Path, bundle: TestBundle) -> dict[str, Any]:
    """The rule the predictions are judged by: a registration's own rule, else the test's."""
    if is_registration_file(test_path):
        return dict(load_registration(test_path).rule)
    return load_rule(bundle.rule_path)


def registration_ref(path: str | Path | None) -> dict[str, Any] | None:
    """{name, path, sha256} of a registration file (its identity is the SHA-256 of its bytes)."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: registration file not found")

    doc = yaml.safe_load(p.read_bytes()) or {}
    return {
        "name": doc.get("name", p.stem) if isinstance(doc, dict) else p.stem,
        "path": str(path),
        "sha256": sha256_file(p),
    }


def _predictor(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    g = git_state()
    return {
        "kind": kind,
        "code_commit": g["commit"],
        "dirty": g["dirty"],
        "command": list(sys.argv),
        "params": dict(params),
    }


def _arms(bundle: TestBundle, arms: Sequence[str] | None) -> list[str]:
    return [find_arm(bundle, a)[0] for a in arms] if arms else list(bundle.arms)


# ---------------------------------------------------------------------------------------------
# the simulator over fresh seeds
# ---------------------------------------------------------------------------------------------
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
) -> PredictionFile:
    """Predictions from the simulator for every registered run of a test (see the module doc).

    band: a value's tolerance is the band the fresh seeds spanned, [min, max] (the paper's
    "inside its 20-seed band" for release times), instead of mean +- tolerance_sd sd."""
    bundle = load_bundle(test_path)
    if registration is None and is_registration_file(test_path):
        registration = test_path  # predictions about a registered test are bound to it
    test_path = str(bundle.path or test_path)
    arm_keys = _arms(bundle, arms)
    rate_list = [float(r) for r in (rates or bundle.test.rates)]
    seeds = list(bundle.test.seeds)
    fresh = list(range(first_seed, first_seed + n_seeds))
    if set(fresh) & set(seeds):
        raise ConfigError(f"fresh seeds {fresh} overlap the test's seeds {seeds}; choose --first-seed outside them")
    if n_seeds < 1:
        raise ConfigError(f"--seeds {n_seeds}: at least one fresh seed is needed")
    bad = set(layers) - {"fresh", "exact"}
    if bad:
        raise ConfigError(f"layers {sorted(bad)}: expected 'fresh' and/or 'exact'")
    floors = {**DEFAULT_TOLERANCE_FLOOR, **(tolerance_floor or {})}
    spec = _rule_of(
        test_path, bundle
    )  # the rule the test names (the built-in E2 rule by default), or the registration's
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="agentload-sim-pred-")
        work = Path(tmp.name)
    else:
        work = Path(work_dir)
    try:
        todo = [(a, r, s) for a in arm_keys for r in rate_list for s in fresh]
        if "exact" in layers:
            todo += [(a, r, s) for a in arm_keys for r in rate_list for s in seeds]
        dirs = _simulate(test_path, todo, work, jobs)
        verdicts = {k: analyze_run(d, spec, series=False).verdict for k, d in dirs.items()}
        extra = {q for q in value_quantities if _INTERVAL.match(q)}
        if extra:
            for k, d in dirs.items():
                verdicts[k].stats.update(interval_quantities(Path(d), extra))
    finally:
        if tmp is not None:
            tmp.cleanup()
    commit = git_state()
    src_base = {
        "kind": "simulator",
        "engine": "harness.refengine.model.EngineModel (virtual time)",
        "engine_commit": commit["commit"],
        "dirty": commit["dirty"],
        "cell": bundle.cell.name,
    }
    state_names = [s["name"] for s in spec["states"]]
    preds: list[Prediction] = []
    for r in rate_list:
        joint: list[bool] = []
        for s in fresh:
            joint.append(all(verdicts[(a, r, s)].good for a in arm_keys))
        for a in arm_keys:
            vs = [verdicts[(a, r, s)] for s in fresh]
            c = _Cell(
                [v.state for v in vs],
                [bool(v.flags.get("stuck")) for v in vs],
                [v.good for v in vs],
                {q: [float(v.stats.get(q, math.nan)) for v in vs] for q in value_quantities},
            )
            src = {
                **src_base,
                "layer": "fresh seeds",
                "seeds": fresh,
                "n_seeds": n_seeds,
                "states": {k: c.states.count(k) for k in sorted(set(c.states))},
            }
            for seed in seeds:
                about = About("run", a, r, seed)
                tag = f"{a}-r{r:.2f}-s{seed}"
                probs = {k: c.states.count(k) / n_seeds for k in state_names}
                preds.append(
                    Prediction(
                        f"sim-{tag}-state",
                        "state",
                        about,
                        "categorical",
                        src,
                        {"probabilities": probs},
                        "simulator fresh",
                    )
                )
                preds.append(
                    Prediction(
                        f"sim-{tag}-stuck",
                        "stuck",
                        about,
                        "probability",
                        src,
                        {"event": {"equals": True}, "probability": sum(c.stuck) / n_seeds},
                        "simulator fresh",
                    )
                )
                preds.append(
                    Prediction(
                        f"sim-{tag}-condition",
                        "arm_condition",
                        about,
                        "probability",
                        src,
                        {"event": {"equals": True}, "probability": sum(c.cond) / n_seeds},
                        "simulator fresh",
                        note=f"the {a} arm's registered condition ({', '.join(_expect(spec, a))})",
                    )
                )
                for q, xs in c.values.items():
                    arr = np.array([x for x in xs if math.isfinite(x)])
                    if arr.size == 0:
                        continue
                    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
                    if band:
                        tolerance, how = (
                            {"interval": [round(float(arr.min()), 6), round(float(arr.max()), 6)]},
                            f"the band of {arr.size} fresh seeds",
                        )
                    else:
                        tol = max(tolerance_sd * sd, float(floors.get(q, 0.0)))
                        tolerance, how = (
                            {"abs": round(tol, 6)},
                            f"max({tolerance_sd:g} sd, floor {floors.get(q, 0.0):g})",
                        )
                    preds.append(
                        Prediction(
                            f"sim-{tag}-{q}",
                            q,
                            about,
                            "value",
                            {**src, "seed_values": [round(float(x), 6) for x in arr]},
                            {"value": round(float(arr.mean()), 6), "tolerance": tolerance},
                            "simulator fresh values",
                            note=f"mean of {arr.size} fresh seeds; tolerance {how}",
                        )
                    )
        p_seed = sum(joint) / n_seeds
        leaves = []
        for seed in seeds:
            pid = f"sim-r{r:.2f}-s{seed}-seed-good"
            leaves.append(pid)
            preds.append(
                Prediction(
                    pid,
                    "seed_good",
                    About("seed", rate=r, seed=seed),
                    "probability",
                    {**src_base, "layer": "fresh seeds", "seeds": fresh, "n_seeds": n_seeds, "joint": joint},
                    {"event": {"equals": True}, "probability": p_seed},
                    "simulator fresh",
                    note="every arm meets its condition in this seed (estimated jointly over fresh seeds)",
                )
            )
        need = int(spec["pass"]["min_good_seeds"])

        preds.append(
            Prediction(
                f"sim-r{r:.2f}-pass",
                "verdict_pass",
                About("rate", rate=r),
                "rule_probability",
                {**src_base, "layer": "fresh seeds", "rule": spec["name"]},
                {
                    "rule": {"at_least": need, "of": [{"prediction": x, "is": True} for x in leaves]},
                    "probability": round(at_least_probability([p_seed] * len(leaves), need), 6),
                },
                "simulator rule",
                note=f"rate passes: >= {need} of {len(leaves)} seeds good (independent seeds)",
            )
        )
        if "exact" in layers:
            for a in arm_keys:
                for seed in seeds:
                    v = verdicts[(a, r, seed)]
                    about = About("run", a, r, seed)
                    tag = f"{a}-r{r:.2f}-s{seed}"
                    src = {**src_base, "layer": "exact plan", "seeds": [seed]}
                    preds.append(
                        Prediction(
                            f"simx-{tag}-state", "state", about, "call", src, {"value": v.state}, "simulator exact plan"
                        )
                    )
                    preds.append(
                        Prediction(
                            f"simx-{tag}-stuck",
                            "stuck",
                            about,
                            "call",
                            src,
                            {"value": bool(v.flags.get("stuck"))},
                            "simulator exact plan",
                        )
                    )
    see = [
        f"the test config {test_path} and the configs it names (cell {bundle.cell.name}, workload {bundle.workload.name})",
        f"simulated runs on fresh seeds {fresh}, which the test does not use",
    ]
    if "exact" in layers:
        see.append(
            f"simulated runs on the registered seeds' own frozen plans (seeds {seeds}): the plans, not any engine run"
        )
    see.append("no run of this test on the engine under test")
    params = {
        "n_seeds": n_seeds,
        "first_seed": first_seed,
        "layers": list(layers),
        "value_quantities": list(value_quantities),
        "tolerance_sd": tolerance_sd,
        "tolerance_floor": floors,
        "band": band,
        "rule": spec["name"],
    }
    return make_file(
        name or f"{bundle.test.name}-simulator",
        preds,
        test=bundle.test.name,
        registration=registration_ref(registration),
        predictor=_predictor("simulator", params),
        could_see=see,
        made_at=utc_precise(),
        description=f"Simulator predictions for test {bundle.test.name}: {n_seeds} fresh seeds per arm and rate",
        scoring_declaration="Probabilities call the side above one half; categorical predictions call their modal state; "
        "values hit inside their stated tolerance; the rate's PASS probability assumes independent seeds.",
    )


def _expect(spec: Mapping[str, Any], arm: str) -> list[str]:
    return arm_expectation(spec, arm)


# ---------------------------------------------------------------------------------------------
# model F on the exact frozen plans
# ---------------------------------------------------------------------------------------------
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
    arm_keys = [a for a in _arms(bundle, arms) if bundle.arms[a].burst]
    if not arm_keys:
        raise ConfigError(
            f"test {bundle.test.name}: model F predicts a trap entered at a burst; no burst arm among {list(bundle.arms)}"
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
                    preds += [
                        Prediction(
                            f"mf-{tag}-S1",
                            f"mean_prompt_{w}",
                            about,
                            "value",
                            ts,
                            {"value": round(asy.tilted_prompt, 3), "tolerance": {"rel": 0.08}},
                            "model F trap state",
                            note="S1: tilted-mix mean prompt of the turns completed in the window",
                        ),
                        Prediction(
                            f"mf-{tag}-S3",
                            "sessions_completed_rate",
                            about,
                            "value",
                            ts,
                            {"value": round(asy.D, 6), "tolerance": {"rel": 0.15}},
                            "model F trap state",
                            note="S3: completions D (the pooled tolerance, applied per run)",
                        ),
                        Prediction(
                            f"mf-{tag}-S4",
                            "slope",
                            about,
                            "value",
                            ts,
                            {"value": round(asy.alpha, 6), "tolerance": {"rel": 0.35}},
                            "model F trap state",
                            note="S4: backlog growth alpha (the pooled tolerance, applied per run)",
                        ),
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
                        note=f"stuck iff the fluid backlog stays above the all-miss onset n_b = {onset.n_b:.1f} over the window",
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
        predictor=_predictor("model_f", params),
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
                note="mu*/lambda_ref: the window's upper end as the curve sets it (the registered edge is min(this, E0b edge))",
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
        predictor=_predictor("entry_model", params),
        made_at=utc_precise(),
        could_see=[f"the cell config {cell.name} and its cost model; the workload {wl.name}; no run"],
        description=f"First-principles entry model for cell {cell.name}",
    )
