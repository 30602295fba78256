"""The cost fit from what a user has: the calibration summaries, the engine's own timings, or both.

Why: per-request engine timings are what a cost model is best fitted to, but a user often has only
the calibration summaries (E0a's token rate and lambda_ref, Stage C's mu(n) and hit curve: the
paper's tables, or runs recorded before an engine reported timings); and where timings exist they
describe the engine core's own steps, not what a request costs on its way in and out, which on a
CPU engine under a quota is a large part of a cached turn's cost. So the fit here matches the
*simulated* summaries to the real ones, with the timing rows (sim2real/costfit.py) in the same
objective when there are runs with timings:

    minimise  sum over fitted summary points w_p (sim / real - 1)^2
            + timing_weight * mean over timing rows (predicted / observed - 1)^2

where w_p is `reference_weight` for E0a's two points and 1 for Stage C's: E0a's lambda_ref and
all-miss token rate are the registered references every run is judged against (a trapped run's
token rate is read as a multiple of the all-miss rate), so a cost that trades them for Stage C's
good state misreads every trapped run by the same factor (the quota-scaled CPU fit with weight 1 put
the all-miss rate 10% low, and replayed trapped runs 4-15% below their real token rates).

over log-multipliers of the cost's parameters (so they stay positive), by trust-region least
squares with finite differences. The simulator plays each point exactly as it was measured: the
cell, the workload, the summary's own protocol (warm-up, window), population and seeds, so common
random numbers hold between evaluations and a residual is the cost's, not the draw's.

What is fitted: Stage C points in the good state (hit fraction within `hit_drop` of the curve's
best) and E0a's lambda_ref and all-miss token rate. Left out, and reported with their residuals at
the fitted cost: Stage C points past the cliff (their mu is set by eviction and thrashing, which the
cost does not set, and in a short window by which of two states the run fell into), points without a
hit fraction, and E0a's saturation check. With timings every parameter the timing fit left non-zero
is free; from summaries alone two multipliers are (the fixed terms a, f0, c_r and the
token-proportional ones b, c_p, c_d, over a base cost's shape): the summaries identify a good-state
speed and an all-miss speed, not the split inside each.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from analysis.calibration_summaries import E0a, StageC, dir_sha256, e0a_values
from harness.config import CellConfig, WorkloadConfig
from harness.config.models import CostConfig
from sim2real.costfit import PARAMS, CostFitError, TimingRows, cost_params, solve_rows

FIXED_TERMS = ("a", "f0", "c_r", "d_r")
TOKEN_TERMS = ("b", "c_p", "c_d")
ALL_TERMS = ("a", "f0", "b", "c_p", "c_d", "c_r", "d_r")
STEP = 0.1  # finite-difference step of a log-multiplier (10%)


@dataclass(frozen=True)
class SummaryPoint:
    """One number of a calibration summary the simulator can reproduce."""

    stage: str  # "stage-c" or "e0a"
    n: int
    measure: str  # mu_turns, mu_sessions, hit_fraction, lambda_ref, all_miss_token_rate, check_mu_turns
    real: float
    seeds: tuple[int, ...]
    fitted: bool
    reason: str = ""  # why it is left out of the fit

    @property
    def label(self) -> str:
        return f"{self.stage} n={self.n} {self.measure}"


def summary_points(stage_c: StageC | None, e0a: E0a | None, *, hit_drop: float = 0.1) -> list[SummaryPoint]:
    """The points of the summaries, each marked fitted or left out (with why)."""
    pts: list[SummaryPoint] = []
    if stage_c is not None:
        by_n: dict[int, list[Any]] = {}
        for p in stage_c.points:
            by_n.setdefault(p.n, []).append(p)
        hits = [p.hit_fraction for p in stage_c.points if p.hit_fraction is not None]
        plateau = max(hits) if hits else None
        for n, ps in sorted(by_n.items()):
            seeds = tuple(p.seed for p in ps)
            turns = [p.mu_turns for p in ps]
            use_turns = all(t is not None for t in turns)
            measure = "mu_turns" if use_turns else "mu_sessions"
            real = float(np.mean([p.mu_turns if use_turns else p.mu_sessions for p in ps]))
            hit = [p.hit_fraction for p in ps]
            if plateau is None or any(h is None for h in hit):
                fitted, why = False, "no hit fraction: whether it is in the good state is unknown"
            else:
                h = float(np.mean([x for x in hit if x is not None]))
                fitted = h >= plateau - hit_drop
                why = (
                    ""
                    if fitted
                    else f"past the cliff (hit {h:.2f} < the curve's best {plateau:.2f} - {hit_drop:g}): its mu is "
                    "set by eviction and thrashing, not by the cost; predicted, not fitted"
                )
            pts.append(SummaryPoint("stage-c", n, measure, real, seeds, fitted, why))
            if all(h is not None for h in hit):
                pts.append(
                    SummaryPoint(
                        "stage-c", n, "hit_fraction", float(np.mean(hit)), seeds, False, "a hit fraction: reported"
                    )
                )
    if e0a is not None:
        ev = e0a_values(e0a, "e0a")
        seeds = tuple(r.seed for r in e0a.per_seed) or (0, 1, 2)
        n = e0a.protocol.n
        pts.append(SummaryPoint("e0a", n, "lambda_ref", ev.lambda_ref, seeds, True))
        if ev.all_miss_token_rate is not None:
            pts.append(SummaryPoint("e0a", n, "all_miss_token_rate", ev.all_miss_token_rate, seeds, True))
        if e0a.check is not None and e0a.check.mu_turns is not None:
            pts.append(
                SummaryPoint(
                    "e0a",
                    e0a.check.n,
                    "check_mu_turns",
                    e0a.check.mu_turns,
                    (e0a.check.seed,),
                    False,
                    "the saturation check: reported, not fitted",
                )
            )
    return pts


@dataclass
class Simulator:
    """Plays summary points in the engine model with a given cost (virtual time, no engine).

    `stage_c` and `e0a` are the calibration stages that play them (runs.closed_runs.stage_c and
    .e0a, given by the command: a workflow package does not import the runs layer), called with the
    cell, the workload, the populations or population, seeds, warm-up and window, and no engine."""

    cell: CellConfig
    workload: WorkloadConfig
    stage_c_times: tuple[float, float]  # warm-up, window
    e0a_times: tuple[float, float]
    stage_c: Callable[..., Sequence[Any]]
    e0a: Callable[..., Any]
    runs: int = 0  # simulated runs so far

    def values(self, cost: CostConfig, points: Sequence[SummaryPoint]) -> list[float]:
        cell = self.cell.model_copy(update={"cost": cost, "cost_file": None})
        out: dict[str, float] = {}
        c_pts = [p for p in points if p.stage == "stage-c"]
        if c_pts:
            ns = sorted({p.n for p in c_pts})
            seeds = sorted({s for p in c_pts for s in p.seeds})
            stats = self.stage_c(
                cell, self.workload, ns, seeds=seeds, warmup=self.stage_c_times[0], window=self.stage_c_times[1]
            )
            self.runs += len(stats)
            for p in c_pts:
                got = [getattr(s, p.measure) for s in stats if s.n == p.n and s.seed in p.seeds]
                out[p.label] = float(np.mean(got))
        e_pts = [p for p in points if p.stage == "e0a" and p.measure != "check_mu_turns"]
        if e_pts:
            e = self.e0a(
                cell,
                self.workload,
                seeds=list(e_pts[0].seeds),
                n=e_pts[0].n,
                check_n=None,
                warmup=self.e0a_times[0],
                window=self.e0a_times[1],
            )
            self.runs += len(e_pts[0].seeds)
            for p in e_pts:
                out[p.label] = float(getattr(e, p.measure))
        for p in points:
            if p.measure == "check_mu_turns":
                s = self.stage_c(
                    cell.model_copy(update={"prefix_cache": False}),
                    self.workload,
                    [p.n],
                    seeds=list(p.seeds),
                    warmup=self.e0a_times[0],
                    window=self.e0a_times[1],
                )
                self.runs += 1
                out[p.label] = float(s[0].mu_turns)
        return [out[p.label] for p in points]


def _groups(start: dict[str, float], timings: bool) -> list[tuple[str, ...]]:
    """The parameter groups that move together: each non-zero parameter alone with timings; the
    fixed and the token-proportional terms from summaries alone."""
    if timings:
        return [(k,) for k in ALL_TERMS if start.get(k, 0.0) > 0]
    groups = [tuple(k for k in g if start.get(k, 0.0) > 0) for g in (FIXED_TERMS, TOKEN_TERMS)]
    return [g for g in groups if g]


class _Budget(Exception):
    """The fit has used its simulated evaluations."""


@dataclass
class SummaryFit:
    params: dict[str, float]
    chunk: int
    method: str  # "timings+summaries" or "summaries"
    start: dict[str, float]
    groups: list[tuple[str, ...]]
    multipliers: list[float]
    points: list[SummaryPoint]
    simulated: list[float]
    timing: TimingRows | None = None
    timing_weight: float = 0.1
    reference_weight: float = 1.0
    evaluations: int = 0
    sim_runs: int = 0
    sources: list[dict[str, str]] = field(default_factory=list)

    def cost(self) -> CostConfig:
        return CostConfig(**cost_params(self.params, self.chunk))

    def theta(self) -> np.ndarray:
        return np.array([self.params.get(k, 0.0) for k in PARAMS])

    def point_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "stage": p.stage,
                "n": p.n,
                "measure": p.measure,
                "seeds": list(p.seeds),
                "real": p.real,
                "simulated": s,
                "rel": (s - p.real) / p.real if p.real else math.nan,
                "fitted": p.fitted,
                **({"left_out": p.reason} if not p.fitted else {}),
            }
            for p, s in zip(self.points, self.simulated, strict=True)
        ]

    def cost_file(self, name: str, engine: str) -> dict[str, Any]:
        fitted = [r for r in self.point_rows() if r["fitted"]]
        worst = max((abs(r["rel"]) for r in fitted), default=math.nan)
        timing = ""
        if self.timing is not None:
            timing = f" and {len(self.timing)} per-request timing observations (weight {self.timing_weight:g})"
        fit: dict[str, Any] = {
            "method": self.method,
            "sources": self.sources,
            "start": {k: float(v) for k, v in self.start.items()},
            "free": [list(g) for g in self.groups],
            "multipliers": [float(m) for m in self.multipliers],
            "evaluations": self.evaluations,
            "simulated_runs": self.sim_runs,
            "points": self.point_rows(),
        }
        quota = None
        fit["reference_weight"] = self.reference_weight
        if self.timing is not None:
            fit["timing"] = {
                "observations": len(self.timing),
                "weight": self.timing_weight,
                "residuals": self.timing.residuals(self.theta()),
            }
            record = self.timing.quota_record()
            if record is not None:
                # the summaries carry no quota of their own: they are taken as measured at the timing runs' mean
                fit["quota_scaling"] = {**record, "summaries": "taken at cpu_quota (they record no quota)"}
                quota = record["cpu_quota"]
        return {
            "kind": "cost",
            "name": name,
            "description": (
                f"Iteration costs of {engine} fitted by `agentload calibrate costs` ({self.method}): the simulated "
                f"calibration summaries matched to the real ones at {len(fitted)} points{timing}; largest |relative "
                f"residual| of a fitted point {worst:.3f}. Points left out and every residual: fit.points."
            ),
            **cost_params(self.params, self.chunk, quota),
            "fit": fit,
        }


def fit_summaries(
    points: Sequence[SummaryPoint],
    sim: Simulator,
    start: dict[str, float],
    chunk: int,
    *,
    timing: TimingRows | None = None,
    timing_weight: float = 0.1,
    max_evaluations: int = 40,
    log: Callable[[str], None] = lambda _m: None,
    reference_weight: float = 1.0,
) -> SummaryFit:
    """Fit the cost to the summaries (and the timing rows, if given) from `start` (parameters by name);
    `reference_weight`: how many points each of E0a's references counts (see the module doc)."""
    if not reference_weight > 0:
        raise CostFitError(f"reference weight: expected > 0, got {reference_weight}")
    fitted = [p for p in points if p.fitted]
    if not fitted:
        raise CostFitError("no summary point to fit: need E0a's rates or Stage C points in the good state")
    groups = _groups(start, timing is not None)
    if not groups:
        raise CostFitError(f"the start cost has no non-zero parameter to scale: {start}")
    real = np.array([p.real for p in fitted])
    # E0a's points are the registered references (lambda_ref, the all-miss token rate) that a rule
    # compares every run with: reference_weight counts each of them that many times
    wts = np.array([math.sqrt(reference_weight) if p.stage == "e0a" else 1.0 for p in fitted])
    cache: dict[tuple[float, ...], np.ndarray] = {}

    def params_at(z: np.ndarray) -> dict[str, float]:
        out = dict(start)
        for g, zi in zip(groups, z, strict=True):
            for k in g:
                out[k] = start[k] * math.exp(float(zi))
        return out

    best: list[tuple[float, np.ndarray]] = []

    def resid(z: np.ndarray) -> np.ndarray:
        key = tuple(np.round(z, 10))
        if key in cache:
            return cache[key]
        if len(cache) >= max_evaluations:
            raise _Budget
        p = params_at(z)
        vals = np.array(sim.values(CostConfig(**cost_params(p, chunk)), fitted))
        r: np.ndarray = (vals / real - 1.0) * wts
        if timing is not None:
            th = np.array([p.get(k, 0.0) for k in PARAMS])
            r = np.concatenate([r, timing.rel(th) * math.sqrt(timing_weight / len(timing))])
        cache[key] = r
        cost = float(np.sum(r**2))
        if not best or cost < best[0][0]:
            best[:] = [(cost, z.copy())]
        log(
            "  eval {:2d}: {}  summary |rel| max {:.3f}".format(
                len(cache),
                " ".join(f"{'/'.join(g)} x{math.exp(v):.3f}" for g, v in zip(groups, z, strict=True)),
                float(np.max(np.abs(r[: len(fitted)]))),
            )
        )
        return r

    def jac(z: np.ndarray) -> np.ndarray:
        # forward differences of 10% in each multiplier: a simulated summary is piecewise constant in
        # the cost at small steps (an iteration boundary moves past an event), so the default step
        # (about 1e-8) sees no slope at all
        r0 = resid(z)
        cols = []
        for j in range(len(z)):
            zj = z.copy()
            zj[j] += STEP
            cols.append((resid(zj) - r0) / STEP)
        return np.column_stack(cols)

    try:
        least_squares(resid, np.zeros(len(groups)), jac=jac, xtol=1e-3, ftol=1e-4)
    except _Budget:
        log(f"  stopped at {max_evaluations} evaluations: the best point so far is taken")
    z_best = best[0][1]
    params = params_at(z_best)
    final = sim.values(CostConfig(**cost_params(params, chunk)), points)
    return SummaryFit(
        params=params,
        chunk=chunk,
        method="timings+summaries" if timing is not None else "summaries",
        start=dict(start),
        groups=groups,
        multipliers=[math.exp(float(v)) for v in z_best],
        points=list(points),
        simulated=final,
        timing=timing,
        timing_weight=timing_weight,
        reference_weight=reference_weight,
        evaluations=len(cache),
        sim_runs=sim.runs,
    )


def timing_start(timing: TimingRows) -> dict[str, float]:
    """The joint fit's start: the timing fit alone (IRLS), f0 = 0, and d_r at the smallest of the runs'
    median server gaps (the lightest load's: the least of it is queueing for the CPU)."""
    th = solve_rows(timing)
    gaps = [g for g in timing.gaps if g == g and g > 0]
    return {"f0": 0.0, **{k: float(v) for k, v in zip(PARAMS, th, strict=True)}, "d_r": min(gaps) if gaps else 0.0}


def cost_start(cost: CostConfig) -> dict[str, float]:
    """A summaries-only fit's start: a cost's parameters with its speed and token factor folded in."""
    s, tf = cost.speed, cost.token_factor
    return {
        "a": cost.a / s,
        "f0": cost.f0 / s,
        "b": cost.b * tf / s,
        "c_p": cost.c_p * tf / s,
        "c_d": cost.c_d * tf / s,
        "c_r": cost.c_r / s,
        "d_r": cost.d_r,  # a delay outside the engine: no speed divides it
    }


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sources(summary_files: dict[str, Path], run_dirs: Sequence[Path], base_cost: Path | None) -> list[dict[str, str]]:
    """What the fit read, by SHA-256: the summary files' bytes, the run directories' tables."""
    out = [{"role": role, "path": str(p), "sha256": file_sha256(p)} for role, p in summary_files.items()]
    out += [{"role": "run", "path": str(d), "sha256": dir_sha256(d)} for d in run_dirs]
    if base_cost is not None:
        out.append({"role": "base-cost", "path": str(base_cost), "sha256": file_sha256(base_cost)})
    return out
