"""The design step's search: the protocol's free knobs as a grid, its candidates evaluated
cheapest first until one is decisive for every arm, and the flip margins of the one proposed
(`agentload prereg design`; what is evaluated and how: prereg/design.py).

Kept apart from the evaluation so that each file holds one job: prereg/design.py says whether one
design is decisive (formulas, then the simulator over fresh seeds); this module orders and prunes
the designs and stops at the first decisive one. Simulated states are read through prereg.design's
own cache (`design._STATES`), so a search and its margins never simulate one run twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import prereg.design as design
from harness.errors import ConfigError
from prereg.design import SCALED_TIMES, Context, Design, FormulaEval, SimEval, formula_eval, sim_bundle, sim_eval
from prereg.margin import DEFAULT_MAX_CHANGE, DEFAULT_TOLERANCE, cell_margins
from prereg.margin_record import e0a_noise, margin_record


# ---------------------------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grid:
    time_factors: tuple[float, ...] = (1.0,)
    post_factors: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    burst_factors: tuple[float, ...] = (1.0, 0.75, 0.5, 0.375, 0.25, 0.1875, 0.125)
    width_factors: tuple[float, ...] = (1.0, 2.0)
    cap_fractions: tuple[float, ...] = (0.95, 0.9, 0.85, 0.8)
    fractions: tuple[tuple[tuple[int, int], ...], ...] = (
        ((1, 3), (2, 3)),
        ((1, 4), (1, 2)),
        ((1, 5), (2, 5)),
        ((1, 4), (3, 4)),
    )
    kept_times: tuple[str, ...] = ()  # protocol times not scaled by the time factors (Design.kept)

    def __post_init__(self) -> None:
        bad = [k for k in self.kept_times if k not in SCALED_TIMES]
        if bad:
            raise ConfigError(
                f"kept_times: {bad} are not protocol times a time factor scales; expected some of {SCALED_TIMES}"
            )

    def designs(self, base_burst: int) -> list[Design]:
        bursts = sorted({max(1, round(base_burst * b)) for b in self.burst_factors}, reverse=True)
        return [
            Design(t, p, b, w, c, fr, self.kept_times)
            for t in self.time_factors
            for p in self.post_factors
            for b in bursts
            for w in self.width_factors
            for c in self.cap_fractions
            for fr in self.fractions
        ]


@dataclass
class Evaluated:
    formula: FormulaEval
    sim: SimEval | None = None
    over_limits: list[str] = field(default_factory=list)  # the baseline's: why the search went on past it

    @property
    def decisive(self) -> bool:
        return self.formula.ok and self.sim is not None and self.sim.decisive

    def why_not(self) -> str:
        if not self.formula.ok:
            return "; ".join(self.formula.reasons)
        if self.sim is None:
            return "not simulated"
        return "" if self.sim.decisive else self.sim.reason


@dataclass
class SearchResult:
    baseline: Evaluated
    proposal: Evaluated | None
    evaluated: list[Evaluated]
    pruned: int
    candidates: int
    sim_runs: int
    searched: bool = True


def over_limits(fe: FormulaEval, overhead_s: float, max_hours: float | None, max_ci_s: float | None) -> list[str]:
    """Why a design is over the cost limits the user set (none: within them)."""
    out = []
    if max_hours is not None and fe.engine_hours(overhead_s) > max_hours:
        out.append(
            f"the full test takes {fe.engine_hours(overhead_s):.2f} engine-hours, over the {max_hours:g} allowed"
        )
    if max_ci_s is not None and fe.ci_seconds(overhead_s) > max_ci_s:
        out.append(f"its CI version takes {fe.ci_seconds(overhead_s) / 60:.1f} min, over the {max_ci_s / 60:g} allowed")
    return out


def search(
    ctx: Context,
    grid: Grid,
    *,
    seeds: Sequence[int],
    need: int,
    margin: float,
    overhead_s: float,
    max_candidates: int = 60,
    jobs: int = 1,
    echo: Any = None,
    max_hours: float | None = None,
    max_ci_s: float | None = None,
) -> SearchResult:
    """The baseline (the template's design) evaluated in full, then candidates in order of cost
    (engine-hours of the full test, then the CI version's time) until one is decisive. A candidate
    over `max_hours` (the full test) or `max_ci_s` (its CI version) is pruned with the formulas'."""
    say = echo or (lambda m: None)
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        base_fe = formula_eval(ctx, ctx.baseline())
        baseline = Evaluated(
            base_fe,
            sim_eval(ctx, base_fe, seeds=seeds, need=need, margin=margin, jobs=jobs, pool=pool, early_exit=False)
            if base_fe.protocol
            else None,
        )
        runs = baseline.sim.runs if baseline.sim else 0
        # A decisive template ends the search unless it is over a limit the user set: then the question
        # is the cheapest decisive design *within* the limits (e.g. a CI version of at most 5 minutes),
        # which the template does not answer. Its evaluation stays as printed; `over_limits` says why.
        baseline.over_limits = over_limits(base_fe, overhead_s, max_hours, max_ci_s)
        if baseline.decisive and not baseline.over_limits:
            return SearchResult(baseline, baseline, [baseline], 0, 1, runs)
        if max_candidates <= 0:
            return SearchResult(baseline, None, [], 0, 0, runs, searched=False)
        cands = [formula_eval(ctx, d) for d in grid.designs(ctx.protocol.burst.size) if d != ctx.baseline()]
        for c in cands:
            c.reasons += over_limits(c, overhead_s, max_hours, max_ci_s)
        ok = sorted(
            (c for c in cands if c.ok),
            key=lambda c: (c.engine_hours(overhead_s), c.ci_seconds(overhead_s), -c.design.burst),
        )
        evaluated: list[Evaluated] = []
        proposal = None
        for fe in ok[:max_candidates]:
            ev = Evaluated(fe, sim_eval(ctx, fe, seeds=seeds, need=need, margin=margin, jobs=jobs, pool=pool))
            runs += ev.sim.runs if ev.sim else 0
            evaluated.append(ev)
            say(
                f"  {fe.engine_hours(overhead_s):6.2f} engine-h  {fe.design.label():60}  "
                f"{'DECISIVE' if ev.decisive else ev.why_not()}"
            )
            if ev.decisive:
                proposal = ev
                break
        return SearchResult(baseline, proposal, evaluated, len(cands) - len(ok), len(cands), runs)
    finally:
        if pool is not None:
            pool.shutdown()


def margins(
    ctx: Context,
    fe: FormulaEval,
    seeds: Sequence[int],
    *,
    max_change: float = DEFAULT_MAX_CHANGE,
    tol: float = DEFAULT_TOLERANCE,
) -> list[dict[str, Any]]:
    """Flip margins of every arm x rate of a design: of the modal state over the fresh seeds, per
    knob (speed, lambda_ref), labelled against E0a's seed spread: the implementation, and so the
    values, a frozen simulator prediction carries (prereg/margin.py `cell_margins`,
    prereg/margin_record.py). The runs the search made at the fitted speed are reused."""
    bundle = sim_bundle(ctx, fe, seeds)
    refs = {"lambda_ref": ctx.lambda_ref, "all_miss_token_rate": ctx.all_miss}
    noise, rule, out = e0a_noise(ctx.inputs.e0a), fe.rule or ctx.rule, []
    for arm in ctx.arms:
        for rate in fe.multiples:
            known = {
                s: design._STATES[k] for s in seeds if (k := design._key(bundle, arm, rate, s, 1.0)) in design._STATES
            }
            cm = cell_margins(
                bundle, arm, rate, seeds, rule, refs, known=known, noise=noise, max_change=max_change, tol=tol
            )
            rec = margin_record(cm.margins, noise, f"the modal state of fresh seeds {list(seeds)}", max_change)
            out.append({"arm": arm.upper(), "rate": rate, **rec, "simulated_runs": cm.simulated})
    return out
