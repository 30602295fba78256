"""Frozen session plans with common random numbers (paper App. E.2).

A plan is everything the open-loop client will do that can be fixed before a run: which sessions
arrive, when, with how many turns, which tool times and which token seed. It is generated once,
written to Parquet and identified by the SHA-256 of the file's bytes; runs are driven by the file.

Common random numbers, and how they are obtained:

* Base arrivals. One Poisson process per seed at an absolute top rate R (sessions/s), each point
  carrying a uniform mark. A run at absolute rate lam keeps the points with mark < lam / R
  (independent thinning), so a lower rate's arrival times are a subset of a higher rate's, in every
  cell, since thinning works on absolute rates. The process is drawn in fixed blocks, each from its
  own counter-based stream, so its first part does not depend on the run's duration.
* The top rate. R is part of the plan's identity (recorded in its metadata, so `regenerate` needs
  nothing else): plans are nested across rates, arms and cells only when they share R. The test
  sets it (TestConfig.top_rate); its default DEFAULT_TOP_RATE = 2.0 sessions/s is the paper's, far
  above any A100 or H200 rate it registered, and keeps every plan made before R was a parameter
  byte-identical. A cell faster than that (a CPU cell at ~14 sessions/s, a large H200 pool, a
  data-parallel deployment) registers a higher R; a rate above R cannot be planned.
* Session identity. The i-th *kept* arrival plays spec ``draw_session(workload, seed, STREAM_BASE,
  i)``, so the i-th arriving session has the same turn count, tool times and tokens at every rate.
* Burst. Offsets uniform in [0, width) from their own per-seed stream, in draw order; a burst of n
  takes the first n offsets and the specs ``STREAM_BURST`` 0..n-1 (the draw of BURST_DRAW = 200 is
  the same everywhere). Rows are then ordered by time.
* Perturbations are transforms of the same draw. CUT keeps, after its start, only the points with
  mark < lam' / R (a further thinning with the same marks). SHED keeps its arrivals in the
  plan, flagged ``refused``, so later sessions keep their identity. MIRROR is a different workload
  file: the same uniforms go through a different turn law.
* Client policies are not plan content: gates (CAPPED, rescue) and TOOLSLOW (which depends on when
  a tool call starts, a run-time quantity) are applied by the client from the arm config, which the
  run's meta.json records. So BURST, CAPPED and rescue plans of a seed and rate are byte-identical,
  and a TOOLSLOW arm replays its NOBURST plan byte for byte.

Determinism: rows in a fixed order, no timestamps, canonical JSON metadata in the Parquet schema,
a fixed writer configuration. The same inputs give the same bytes in any process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness.config import (
    DEFAULT_TOP_RATE,
    ArmConfig,
    Cut,
    ProtocolConfig,
    Shed,
    WorkloadConfig,
    parse_config,
    rate_above_top,
)
from harness.errors import PlanError
from harness.workload.draws import STREAM_BASE, STREAM_BURST, SessionSpec, _generator, draw_session
from harness.workload.planfile import GENERATOR_VERSION, Plan

BURST_DRAW = 200  # the burst draw every burst size takes a prefix of

_ARRIVAL_DOMAIN = 0x617272  # separates the arrival process from every session stream
_BURST_DOMAIN = 0x627273
_BLOCK = 4096  # points of the top-rate process drawn per counter-based block


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------
def top_process(seed: int, horizon: float, top_rate: float = DEFAULT_TOP_RATE) -> tuple[np.ndarray, np.ndarray]:
    """Points of the per-seed Poisson process at `top_rate` in [0, horizon) and their uniform marks."""
    times: list[np.ndarray] = []
    marks: list[np.ndarray] = []
    start = 0.0
    block = 0
    while start < horizon:
        g = _generator(_ARRIVAL_DOMAIN, seed, block)
        gaps = g.exponential(1.0 / top_rate, _BLOCK)
        m = g.random(_BLOCK)
        t = start + np.cumsum(gaps)
        times.append(t)
        marks.append(m)
        start = float(t[-1])
        block += 1
    all_t = np.concatenate(times) if times else np.empty(0)
    all_m = np.concatenate(marks) if marks else np.empty(0)
    keep = all_t < horizon
    return all_t[keep], all_m[keep]


def burst_offsets(seed: int, n: int, width: float) -> np.ndarray:
    """Offsets of a burst of n from its start, in draw order: always a prefix of the same draw."""
    u = _generator(_BURST_DOMAIN, seed).random(max(n, BURST_DRAW))
    return u[:n] * width


def plan_arm(arm: ArmConfig, protocol: ProtocolConfig) -> dict[str, Any]:
    """The part of an arm that changes the plan: burst size, CUT, SHED. Gates and TOOLSLOW do not."""
    size = (arm.burst_size if arm.burst_size is not None else protocol.burst.size) if arm.burst else 0
    return {
        "burst_size": int(size),
        "cut": arm.cut.model_dump(mode="json") if arm.cut else None,
        "shed": arm.shed.model_dump(mode="json") if arm.shed else None,
    }


def _config_json(model: WorkloadConfig | ProtocolConfig) -> dict[str, Any]:
    # The description is prose; leaving it out keeps a reworded comment from changing a plan's hash.
    data = model.model_dump(mode="json")
    data.pop("description", None)
    return data


def make_plan(
    workload: WorkloadConfig,
    protocol: ProtocolConfig,
    arm: ArmConfig,
    rate: float,
    lambda_ref: float,
    seed: int,
    top_rate: float = DEFAULT_TOP_RATE,
) -> Plan:
    """Build the plan of one (workload, protocol, arm, rate x lambda_ref, seed) from the base
    stream at `top_rate` sessions/s (the test's registered top rate)."""
    return _build(
        _config_json(workload), _config_json(protocol), plan_arm(arm, protocol), rate, lambda_ref, seed, top_rate
    )


def regenerate(plan: Plan) -> Plan:
    """Rebuild a plan from its own metadata: the file alone is enough to reproduce it."""
    m = plan.meta
    if m.get("generator_version") != GENERATOR_VERSION:
        raise PlanError(
            f"plan was made by generator version {m.get('generator_version')}; this code is version "
            f"{GENERATOR_VERSION}: check out the commit that made it to regenerate it"
        )
    return _build(
        m["workload"],
        m["protocol"],
        m["arm"],
        m["rate"],
        m["lambda_ref"],
        m["seed"],
        m.get("top_rate", DEFAULT_TOP_RATE),
    )


def _build(
    workload_json: dict[str, Any],
    protocol_json: dict[str, Any],
    arm_part: dict[str, Any],
    rate: float,
    lambda_ref: float,
    seed: int,
    top_rate: float = DEFAULT_TOP_RATE,
) -> Plan:
    workload = parse_config(workload_json, WorkloadConfig, "plan workload")
    protocol = parse_config(protocol_json, ProtocolConfig, "plan protocol")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PlanError(f"seed: got {seed!r}; expected a non-negative integer")
    for name, value in (("rate", rate), ("lambda_ref", lambda_ref), ("top_rate", top_rate)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise PlanError(f"{name}: got {value!r}; expected a positive number")
    rate_abs = float(rate) * float(lambda_ref)
    cut = Cut(**arm_part["cut"]) if arm_part["cut"] else None
    shed = Shed(**arm_part["shed"]) if arm_part["shed"] else None
    top_rate = float(top_rate)
    for label, mult in (("rate", float(rate)), ("cut.rate", cut.rate if cut else 0.0)):
        problem = rate_above_top(mult, float(lambda_ref), top_rate)
        if problem:
            raise PlanError(f"{label}: {problem}")

    if cut is not None and cut.rate > float(rate):
        # The cut keeps the points already kept whose marks pass a second threshold, so it can
        # only lower the rate; a higher cut rate would leave the arrivals unchanged while the
        # nominal rate (rate_report, ks_exponential) claimed the higher one.
        raise PlanError(
            f"cut.rate: got {cut.rate} x lambda_ref; expected at most the run's rate {float(rate)} x lambda_ref "
            "(a cut thins the base stream, it cannot raise it)"
        )
    duration = protocol.duration
    t, marks = top_process(int(seed), duration, top_rate)
    keep = marks < rate_abs / top_rate
    if cut is not None:
        after = t >= cut.start
        keep &= ~after | (marks < cut.rate * lambda_ref / top_rate)
    base_t = t[keep]

    rows: list[SessionSpec] = [
        draw_session(workload, int(seed), STREAM_BASE, i, float(a)) for i, a in enumerate(base_t)
    ]
    n_burst = int(arm_part["burst_size"])
    if n_burst > 0:
        offsets = burst_offsets(int(seed), n_burst, protocol.burst.width)
        for j, off in enumerate(offsets):
            rows.append(draw_session(workload, int(seed), STREAM_BURST, j, float(protocol.burst.time + off)))
    if shed is not None:
        lo, hi = shed.start, shed.start + shed.duration
        rows = [replace(s, refused=True) if lo <= s.arrival < hi else s for s in rows]
    rows.sort(key=lambda s: (s.arrival, s.stream, s.index))

    meta = {
        "format": "agentload-plan",
        "generator_version": GENERATOR_VERSION,
        "seed": int(seed),
        "rate": float(rate),
        "lambda_ref": float(lambda_ref),
        "rate_abs": rate_abs,
        "top_rate": top_rate,
        "workload": workload_json,
        "protocol": protocol_json,
        "arm": arm_part,
        "counts": {
            "base": len(base_t),
            "burst": n_burst,
            "refused": sum(1 for s in rows if s.refused),
            "turns": sum(s.n_turns for s in rows),
        },
    }
    return Plan(sessions=tuple(rows), meta=meta)


# ---------------------------------------------------------------------------------------------
# realized arrivals against nominal
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowRate:
    """Arrivals a plan delivers in a window against what its nominal rate promises."""

    label: str
    kind: str  # 'base' (Poisson stream, refused included) or 'burst'
    start: float
    end: float
    arrivals: int
    refused: int
    expected: float

    @property
    def realized_rate(self) -> float:
        return self.arrivals / (self.end - self.start)

    @property
    def deviation(self) -> float:
        """Relative shortfall (<0) or excess (>0) of arrivals against nominal."""
        return self.arrivals / self.expected - 1.0 if self.expected > 0 else float("nan")

    @property
    def z(self) -> float:
        """Poisson standard deviations from nominal (0 for the burst, which is exact by design)."""
        return (
            (self.arrivals - self.expected) / math.sqrt(self.expected)
            if self.kind == "base" and self.expected > 0
            else 0.0
        )


def default_windows(plan: Plan) -> list[tuple[str, float, float]]:
    """Before the burst, the burst, burst to window, the evaluation window, the run; CUT/SHED spans."""
    p = plan.protocol
    b, w = p.burst.time, p.window
    out: list[tuple[str, float, float]] = []
    if p.burst.size > 0 and 0 < b < p.duration:
        out.append(("before burst", 0.0, b))
        out.append(("during burst", b, b + p.burst.width))
        if w.start > b:
            out.append(("burst to window", b, w.start))
    elif w.start > 0:
        out.append(("before window", 0.0, w.start))
    out.append(("evaluation window", w.start, w.end))
    cut = plan.meta["arm"]["cut"]
    if cut is not None:
        out.append(("after cut", float(cut["start"]), p.duration))
    shed = plan.meta["arm"]["shed"]
    if shed is not None:
        out.append(("shed", float(shed["start"]), float(shed["start"]) + float(shed["duration"])))
    out.append(("whole run", 0.0, p.duration))
    return out


def rate_report(plan: Plan, windows: Sequence[tuple[str, float, float]] | None = None) -> list[WindowRate]:
    """Realized base arrivals per window against nominal, plus the burst's own row."""
    base = np.array([s.arrival for s in plan.sessions if s.stream == STREAM_BASE])
    base_ref = np.array([s.arrival for s in plan.sessions if s.stream == STREAM_BASE and s.refused])
    out: list[WindowRate] = []
    for label, lo, hi in windows if windows is not None else default_windows(plan):
        n = int(((base >= lo) & (base < hi)).sum())
        r = int(((base_ref >= lo) & (base_ref < hi)).sum())
        out.append(WindowRate(label, "base", lo, hi, n, r, plan.expected_arrivals(lo, hi)))
    n_burst = int(plan.meta["arm"]["burst_size"])
    if n_burst:
        t0 = float(plan.meta["protocol"]["burst"]["time"])
        w = float(plan.meta["protocol"]["burst"]["width"])
        bursts = [s for s in plan.sessions if s.stream == STREAM_BURST]
        out.append(
            WindowRate(
                "burst sessions", "burst", t0, t0 + w, len(bursts), sum(s.refused for s in bursts), float(n_burst)
            )
        )
    return out


@dataclass(frozen=True)
class KSResult:
    statistic: float
    pvalue: float
    n: int


def ks_exponential(plan: Plan) -> KSResult:
    """KS test of the base inter-arrival times against the nominal exponential law.

    Gaps are rescaled by the nominal rate's integral (time rescaling), so a plan whose rate changes
    at a CUT is tested against Exp(1) as a whole.
    """
    from scipy import stats

    times = sorted(s.arrival for s in plan.sessions if s.stream == STREAM_BASE)
    prev = 0.0
    gaps = []
    for t in times:
        gaps.append(plan.expected_arrivals(prev, t))
        prev = t
    if len(gaps) < 2:
        return KSResult(float("nan"), float("nan"), len(gaps))
    res = stats.kstest(np.asarray(gaps), "expon")
    return KSResult(float(res.statistic), float(res.pvalue), len(gaps))
