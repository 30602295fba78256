"""How far a simulated outcome is from flipping: the flip margin, and the simulator as a function
of the engine's speed.

Why: a simulated run that ends TRAPPED says little about a real engine if 3% more speed would have
let it recover; the sim-to-real gap of a fitted cost model is larger than that (the CPU vLLM's
NOBURST was served 2-3x faster in the simulator than on the engine). The *flip margin* of a run is
the smallest relative change of the cost model's speed (CostConfig.speed: every iteration cost is
divided by it) at which the simulated state differs from its state at the fitted speed, in each
direction, found by bisection. A design (prereg/design.py) is decisive only where its outcomes
survive a stated margin; predictions can report it beside a simulated call (issue "sim-to-real").

`flip_margin(state_at, ...)` is generic: `state_at(factor)` returns a state for the speed factor
(1.0 = the fitted cost). The bisection assumes the state changes once in each direction; where it
changes back and forth the margin found is a change that flips it, not necessarily the smallest.
`SimRun` builds `state_at` for one run of a test bundle in the simulator, judged by a rule.

What a changed speed stands for: an engine faster or slower than its fitted cost model, whose
references were measured on it (E0a is made on the engine, not on the model). So by default the
all-miss token reference moves with the speed (`scale_token_reference`): TRAPPED compares a run's
uncached token rate with the all-miss rate of the same engine, and a speed margin should measure
whether the trap forms (or the good state holds), not re-count the token-rate tolerance, which on
a real engine the speed pin (harness/servers/speedpin.py) holds to a few percent. Arrival rates
stay what the registration says, in sessions/s.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.paired import paired_run
from analysis.staged_analysis import run_quantities
from harness.config import TestBundle
from runs.arms import execute_run


@dataclass(frozen=True)
class FlipMargin:
    """Relative speed changes that flip the state: faster = speed x (1 + faster), slower = speed x
    (1 - slower); None where no change up to `max_change` flips it (the margin exceeds it)."""

    base: str
    faster: float | None
    slower: float | None
    max_change: float
    evaluations: int

    @property
    def margin(self) -> float:
        """The smaller of the two (max_change where neither direction flips)."""
        vals = [x for x in (self.faster, self.slower) if x is not None]
        return min(vals) if vals else self.max_change

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "faster": self.faster,
            "slower": self.slower,
            "margin": self.margin,
            "max_change": self.max_change,
            "bounded": self.faster is not None or self.slower is not None,
            "evaluations": self.evaluations,
        }


def _bisect(flips: Callable[[float], bool], max_change: float, tol: float) -> tuple[float | None, int]:
    """The smallest change in (0, max_change] at which `flips` holds, to within `tol`; None if it
    does not hold at max_change."""
    n = 1
    if not flips(max_change):
        return None, n
    lo, hi = 0.0, max_change
    while hi - lo > tol:
        mid = (lo + hi) / 2
        n += 1
        if flips(mid):
            hi = mid
        else:
            lo = mid
    return round(hi, 6), n


def flip_margin(
    state_at: Callable[[float], str],
    *,
    base: str | None = None,
    max_change: float = 0.5,
    tol: float = 0.01,
    directions: tuple[str, ...] = ("faster", "slower"),
) -> FlipMargin:
    """The flip margin of `state_at` around factor 1.0, by bisection in each direction."""
    if not 0 < max_change < 1:
        raise ValueError(f"max_change: expected a relative change in (0, 1), got {max_change}")
    if not 0 < tol < max_change:
        raise ValueError(f"tol: expected 0 < tol < max_change, got {tol}")
    s0 = base if base is not None else state_at(1.0)
    evals = 0 if base is not None else 1
    out: dict[str, float | None] = {"faster": None, "slower": None}
    for d in directions:
        sign = 1.0 if d == "faster" else -1.0

        def flips(x: float, sign: float = sign) -> bool:  # the direction bound now, not at the loop's end
            return state_at(1.0 + sign * x) != s0

        m, n = _bisect(flips, max_change, tol)
        out[d] = m
        evals += n
    return FlipMargin(s0, out["faster"], out["slower"], max_change, evals)


class SimRun:
    """One run of a test bundle in the simulator, its state as a function of the speed factor.

    Each call simulates into a scratch folder (removed after), with the cell's cost speed multiplied
    by the factor, and judges the run by `rule` with `refs` (lambda_ref, all_miss_token_rate; the
    latter x the factor with `scale_token_reference`, see the module doc). States are cached by factor."""

    def __init__(
        self,
        bundle: TestBundle,
        arm: str,
        rate: float,
        seed: int,
        rule: Mapping[str, Any],
        refs: Mapping[str, float],
        scratch: Path | None = None,
        scale_token_reference: bool = True,
    ) -> None:
        self.bundle, self.arm, self.rate, self.seed = bundle, arm, float(rate), int(seed)
        self.rule, self.refs = rule, dict(refs)
        self.scratch = scratch
        self.scale_token_reference = scale_token_reference
        self.cache: dict[float, tuple[str, dict[str, Any]]] = {}

    def run(self, factor: float = 1.0) -> tuple[str, dict[str, Any]]:
        key = round(float(factor), 9)
        if key in self.cache:
            return self.cache[key]
        cell = self.bundle.cell
        cost = cell.cost.model_copy(update={"speed": cell.cost.speed * key})
        bundle = TestBundle(
            self.bundle.test,
            cell.model_copy(update={"cost": cost}),
            self.bundle.workload,
            self.bundle.protocol,
            self.bundle.arms,
            self.bundle.path,
            self.bundle.arm_refs,
            self.bundle.rule_path,
        )
        tmp = Path(tempfile.mkdtemp(prefix="agentload-margin-", dir=self.scratch))
        try:
            res = execute_run(bundle, self.arm, self.rate, self.seed, "sim", tmp / "run")
            if res.status != "COMPLETED":
                raise RuntimeError(
                    f"simulated run {self.arm} x {self.rate:g} seed {self.seed} ended {res.status}: {res.reason}"
                )
            refs = dict(self.refs)
            if self.scale_token_reference:
                refs["all_miss_token_rate"] = refs["all_miss_token_rate"] * key
            v = paired_run(self.rule, run_quantities(tmp / "run", self.rule, refs_override=refs, series=False).run)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        stats = v["stats"]
        out = (
            v["state"],
            {k: stats.get(k) for k in ("token_ratio", "slope", "slope_threshold", "hit_last", "outstanding_last")},
        )
        self.cache[key] = out
        return out

    def state_at(self, factor: float) -> str:
        return self.run(factor)[0]

    def margin(self, max_change: float = 0.5, tol: float = 0.01) -> FlipMargin:
        return flip_margin(self.state_at, max_change=max_change, tol=tol)
