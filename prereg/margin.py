"""How far a simulated outcome is from flipping: the flip margin, and the simulator as a function
of the engine's speed.

Why: a simulated run that ends TRAPPED says little about a real engine if 3% more speed would have
let it recover; the sim-to-real gap of a fitted cost model is larger than that (the CPU vLLM's
NOBURST was served 2-3x faster in the simulator than on the engine). The *flip margin* of a run is
the smallest relative change of the cost model's speed (CostConfig.speed: every iteration cost is
divided by it) at which the simulated state differs from its state at the fitted speed, in each
direction, found by bisection. A design (prereg/design.py) is decisive only where its outcomes
survive a stated margin; predictions can report it beside a simulated call (issue "sim-to-real").

`flip_margin(state_at, ...)` is generic: `state_at(factor)` returns a state for the factor (1.0 =
the fitted cost, the registered lambda_ref). The bisection assumes the state changes once in each
direction; where it changes back and forth the margin found is a change that flips it, not
necessarily the smallest. `SimRun` builds `state_at` for one run of a test bundle in the simulator,
judged by a rule, with one knob moved: the cost's speed, or lambda_ref (`KNOBS`). `ModalState`
does it for the modal state over seeds (what a frozen simulator prediction calls), and
`cell_margins` gives the margins one prediction carries (prereg/margin_record.py labels them
against E0a's seed spread); the design step and `predict make sim` both call it, so both report
the same values.

What a changed speed stands for: an engine faster or slower than its fitted cost model, whose
references were measured on it (E0a is made on the engine, not on the model). So by default the
all-miss token reference moves with the speed (`scale_token_reference`): TRAPPED compares a run's
uncached token rate with the all-miss rate of the same engine, and a speed margin should measure
whether the trap forms (or the good state holds), not re-count the token-rate tolerance, which on
a real engine the speed pin (harness/servers/speedpin.py) holds to a few percent. Arrival rates
stay what the registration says, in sessions/s.

What a changed lambda_ref stands for: a calibration whose E0a read lambda_ref x factor. The
registered multiples then stand for arrival rates x factor in sessions/s, and the rule judges with
lambda_ref x factor (lam, lam_miss, the slope threshold, completions in lambda_ref); the engine
(the cost) and the all-miss token reference stay. So the lambda_ref margin says how far the load
the registration offers the engine can move before the predicted state changes.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.paired import paired_run
from analysis.staged_analysis import run_quantities
from harness.config import TestBundle
from runs.arms import execute_run

# The bisection's defaults, shared by `predict make sim` and `prereg design` (one implementation):
# a change is resolved to DEFAULT_TOLERANCE (absolute, in relative change), and no change beyond
# DEFAULT_MAX_CHANGE is tried (a margin beyond it is reported as "more than" it).
DEFAULT_TOLERANCE = 0.02
DEFAULT_MAX_CHANGE = 0.5
# What a margin moves: the cost's speed (CostConfig.speed) or the registered lambda_ref.
KNOBS = ("speed", "lambda_ref")
# The names of the two directions of each knob (factor 1 + x, factor 1 - x).
DIRECTIONS = {"speed": ("faster", "slower"), "lambda_ref": ("higher", "lower")}


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


def _bisect(
    flips: Callable[[float], bool], max_change: float, tol: float, probe: float | None = None
) -> tuple[float | None, int]:
    """The smallest change in (0, max_change] at which `flips` holds, to within `tol`; None if it
    does not hold at max_change. A `probe` in (0, max_change) is tried first (one evaluation more at
    most): whether the state flips within it is then known exactly, not to within `tol` (the
    knife-edge label asks just that, with the calibration's noise as the probe)."""
    n = 1
    if not flips(max_change):
        return None, n
    lo, hi = 0.0, max_change
    if probe is not None and 0 < probe < max_change:
        n += 1
        if flips(probe):
            hi = probe
        else:
            lo = probe
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
    max_change: float = DEFAULT_MAX_CHANGE,
    tol: float = DEFAULT_TOLERANCE,
    directions: tuple[str, ...] = ("faster", "slower"),
    probe: float | None = None,
) -> FlipMargin:
    """The flip margin of `state_at` around factor 1.0, by bisection in each direction ("faster" is
    factor 1 + x, "slower" 1 - x, whatever the knob); `probe` as in `_bisect`."""
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

        m, n = _bisect(flips, max_change, tol, probe)
        out[d] = m
        evals += n
    return FlipMargin(s0, out["faster"], out["slower"], max_change, evals)


class SimRun:
    """One run of a test bundle in the simulator, its state as a function of one knob's factor.

    Each call simulates into a scratch folder (removed after), with the knob moved by the factor
    (`speed`: the cell's cost speed x factor; `lambda_ref`: the registered lambda_ref x factor, see
    the module doc), and judges the run by `rule` with `refs` (lambda_ref, all_miss_token_rate; the
    latter x the factor with `scale_token_reference` when the speed moves, lambda_ref x the factor
    when it moves). States are cached by factor; `known` adds one simulated elsewhere (a
    prediction's own run at factor 1), so it is not simulated again."""

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
        knob: str = "speed",
    ) -> None:
        if knob not in KNOBS:
            raise ValueError(f"knob: got {knob!r}; expected one of {list(KNOBS)}")
        self.bundle, self.arm, self.rate, self.seed = bundle, arm, float(rate), int(seed)
        self.rule, self.refs = rule, dict(refs)
        self.scratch = scratch
        self.scale_token_reference = scale_token_reference
        self.knob = knob
        self.cache: dict[float, tuple[str, dict[str, Any]]] = {}

    def known(self, factor: float, state: str, stats: Mapping[str, Any]) -> None:
        """Record the state of a run at `factor` simulated and judged elsewhere (the same bundle, arm,
        rate, seed and references)."""
        self.cache[round(float(factor), 9)] = (state, {k: stats.get(k) for k in _STATS})

    def _moved(self, key: float) -> tuple[TestBundle, dict[str, float]]:
        cell, test = self.bundle.cell, self.bundle.test
        refs = dict(self.refs)
        if self.knob == "speed":
            cell = cell.model_copy(update={"cost": cell.cost.model_copy(update={"speed": cell.cost.speed * key})})
            if self.scale_token_reference:
                refs["all_miss_token_rate"] = refs["all_miss_token_rate"] * key
        else:
            refs["lambda_ref"] = refs["lambda_ref"] * key
            cell = cell.model_copy(update={"lambda_ref": refs["lambda_ref"]})
            if test.references is not None and test.references.lambda_ref is not None:
                test = test.model_copy(
                    update={"references": test.references.model_copy(update={"lambda_ref": refs["lambda_ref"]})}
                )
        return dataclasses.replace(self.bundle, test=test, cell=cell), refs

    def run(self, factor: float = 1.0) -> tuple[str, dict[str, Any]]:
        key = round(float(factor), 9)
        if key in self.cache:
            return self.cache[key]
        bundle, refs = self._moved(key)
        tmp = Path(tempfile.mkdtemp(prefix="agentload-margin-", dir=self.scratch))
        try:
            res = execute_run(bundle, self.arm, self.rate, self.seed, "sim", tmp / "run")
            if res.status != "COMPLETED":
                raise RuntimeError(
                    f"simulated run {self.arm} x {self.rate:g} seed {self.seed} ({self.knob} x{key:g}) ended "
                    f"{res.status}: {res.reason}"
                )
            v = paired_run(self.rule, run_quantities(tmp / "run", self.rule, refs_override=refs, series=False).run)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        out = (v["state"], {k: v["stats"].get(k) for k in _STATS})
        self.cache[key] = out
        return out

    def state_at(self, factor: float) -> str:
        return self.run(factor)[0]

    def margin(self, max_change: float = DEFAULT_MAX_CHANGE, tol: float = DEFAULT_TOLERANCE) -> FlipMargin:
        return flip_margin(self.state_at, max_change=max_change, tol=tol)


_STATS = ("token_ratio", "slope", "slope_threshold", "hit_last", "outstanding_last")


def _run_at(run: SimRun, factor: float) -> tuple[str, dict[str, Any]]:
    """`run.run(factor)` in a worker process (the result goes back into the caller's cache)."""
    return run.run(factor)


def modal(states: Sequence[str]) -> str:
    """The modal state of `states` (what a categorical prediction calls); a tie is "TIE:A/B"."""
    counts = {s: states.count(s) for s in sorted(set(states))}
    top = max(counts.values())
    best = [s for s, c in counts.items() if c == top]
    return best[0] if len(best) == 1 else "TIE:" + "/".join(best)


class ModalState:
    """The modal state over seeds of one arm x rate as a function of a knob's factor: the state a
    frozen simulator prediction calls (its categorical's modal state; one seed: that seed's own).

    The seeds are simulated `jobs` at a time (in `pool` when given: several ModalStates may share
    one pool from threads, see prereg/predict_margins.py), and no further once one state holds a
    strict majority, which no remaining seed can change."""

    def __init__(self, runs: Sequence[SimRun], pool: Executor | None = None, jobs: int = 1) -> None:
        if not runs:
            raise ValueError("ModalState: at least one seed's run is needed")
        self.runs, self.pool, self.jobs = list(runs), pool, max(1, int(jobs))

    def state_at(self, factor: float) -> str:
        key = round(float(factor), 9)
        n = len(self.runs)
        states: list[str] = []
        todo = list(self.runs)
        while todo:
            counts = {s: states.count(s) for s in set(states)}
            if counts and max(counts.values()) * 2 > n:
                break
            batch, todo = todo[: self.jobs], todo[self.jobs :]
            new = [r for r in batch if key not in r.cache]
            if self.pool is not None and new:  # in the pool even alone: other chains may be waiting on it too
                for r, got in zip(new, self.pool.map(_run_at, new, [key] * len(new))):
                    r.cache[key] = got
            states += [r.run(key)[0] for r in batch]
        return modal(states)


@dataclass(frozen=True)
class CellMargins:
    """The flip margins of one arm x rate's modal state per knob, and how many runs were simulated
    for them (the reused runs at factor 1 not counted)."""

    margins: dict[str, FlipMargin]
    simulated: int


def cell_margins(
    bundle: TestBundle,
    arm: str,
    rate: float,
    seeds: Sequence[int],
    rule: Mapping[str, Any],
    refs: Mapping[str, float],
    *,
    known: Mapping[int, tuple[str, Mapping[str, Any]]] | None = None,
    noise: Mapping[str, float | None] | None = None,
    max_change: float = DEFAULT_MAX_CHANGE,
    tol: float = DEFAULT_TOLERANCE,
    knobs: Sequence[str] = KNOBS,
    pool: Executor | None = None,
    jobs: int = 1,
) -> CellMargins:
    """The flip margins of the modal state of `arm` x `rate` over `seeds`, per knob, by bisection.

    `known`: seed -> (state, stats) of the runs at factor 1 already simulated (a prediction's own),
    reused. `noise`: knob -> the calibration's relative noise; tried first in each direction, so
    whether the state flips within the noise is known exactly (`margin_record` labels it)."""
    out: dict[str, FlipMargin] = {}
    simulated = 0
    for knob in knobs:
        runs = [SimRun(bundle, arm, rate, s, rule, refs, knob=knob) for s in seeds]
        for r in runs:
            if known and r.seed in known:
                r.known(1.0, *known[r.seed])
        reused = sum(len(r.cache) for r in runs)
        probe = (noise or {}).get(knob)
        out[knob] = flip_margin(ModalState(runs, pool, jobs).state_at, max_change=max_change, tol=tol, probe=probe)
        simulated += sum(len(r.cache) for r in runs) - reused
    return CellMargins(out, simulated)
