"""The paired test's verdict (E2, App. E.5): the staged engine's judgment in the layout the E2
verdict has always had (Table 7).

The staged engine judges E2 like every other family (analysis/rulespecs/e2.yaml); this module only
lays its results out, deciding nothing: per run its state (the `state` label, or one of UNJUDGED),
whether the arm's expected state holds, the flags and the window statistics; per rate the
group's outcome, its good seeds and each seed's states; the test's outcome. Whoever reads an E2
verdict (the Table 7 report, the kill conditions, `status`, the HTML page, prediction scoring)
reads this layout, which is also what the code of an earlier commit writes when it judges a
registration made before E2 became a staged spec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.openloop import verdict_block
from analysis.quantities import RATIOS, WINDOW_STATISTICS
from analysis.rules import arm_expectation, is_paired_form
from analysis.stages import COUNTED, StagedRun

PAIRED_REPORT = "e2"
# A run's statistics in the verdict, in this order: the window's, the ratios, the wall time.
STATS = (*WINDOW_STATISTICS, *RATIOS, "wall_s")
PASS, FAIL, INCOMPLETE = "PASS", "FAIL", "INCOMPLETE"


def is_paired(spec: Mapping[str, Any]) -> bool:
    """A rule whose verdict has the paired layout: the E2 family's spec (report e2), or a rule in
    the paired form an earlier commit's code judges."""
    return spec.get("report") == PAIRED_REPORT or is_paired_form(spec)


def _num(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# The E2 states of a run with no judged state: missing, its window shorter than min_window, not
# counted by the rule's `run.count_if`, or failed (any other status). Whoever reads the layout (the
# kill conditions, prediction scoring, the HTML page) treats them alike: no evidence for or against
# the arm's expectation.
UNJUDGED = ("MISSING", "FAILED", "INVALID", "NOT-COUNTED")


def paired_state(run: StagedRun) -> str:
    """The run's E2 state: its state label when it counts; else MISSING, INVALID (window shorter
    than min_window), NOT-COUNTED (it completed, but a condition of the rule's `run.count_if` does
    not hold: e.g. the pinned speed did not hold to the end) or FAILED (any other status: failed,
    interrupted, partial, refused)."""
    if run.status == COUNTED:
        return str(run.labels["state"])
    return run.status if run.status in UNJUDGED else "FAILED"


def paired_run(spec: Mapping[str, Any], run: StagedRun) -> dict[str, Any]:
    """One run as the E2 verdict lists it. An arm the rule has no expectation for is refused."""
    expect = arm_expectation(spec, run.arm) if run.status != "MISSING" else []
    state = paired_state(run)
    counted = run.status == COUNTED
    conditions = (
        {
            st: [{"condition": c["condition"], "holds": c["holds"]} for c in cs]
            for st, cs in run.conditions["state"].items()
        }
        if counted
        else {}
    )
    return {
        "arm": run.arm,
        "rate": run.rate,
        "seed": run.seed,
        "state": state,
        "good": counted and state in expect,
        "conditions": conditions,
        "flags": dict(run.flags),
        "stats": {k: _num(run.quantities[k]) for k in STATS if k in run.quantities},
        "reason": run.reason,
        "run_dir": run.run_dir,
    }


def _seed_states(runs: Sequence[StagedRun], arms: Sequence[str], rate: float, seed: int) -> dict[str, str]:
    by = {r.arm.upper(): r for r in runs if r.seed == seed and abs(r.rate - rate) < 1e-9}
    return {arm: (paired_state(by[arm.upper()]) if arm.upper() in by else "MISSING") for arm in arms}


def paired_rates(
    spec: Mapping[str, Any], verdict: Mapping[str, Any], runs: Sequence[StagedRun], arms: Sequence[str]
) -> list[dict[str, Any]]:
    """Per registered rate (the staged verdict's groups): the outcome, the good seeds, why, and every
    seed's state per arm."""
    out = []
    min_seeds = spec["group"].get("min_seeds")
    need = spec["params"]["min_good_seeds"]
    for g in verdict["groups"]:
        seeds = [int(s) for s in g["seeds"]]
        good = [int(s) for s, sd in g["seeds"].items() if sd["decided"] and sd["derived"].get("good") is True]
        undecided = sum(1 for sd in g["seeds"].values() if not sd["decided"])
        n, k = len(seeds), len(good)
        if min_seeds is not None and n < int(min_seeds):
            reason = f"{n} seeds registered; the rule needs at least {min_seeds}"
        elif g["outcome"] == PASS:
            reason = f"{k} of {n} seeds meet every arm condition"
        elif g["outcome"] == INCOMPLETE:
            reason = f"{k} of {n} seeds pass; {undecided} more could with their missing or failed runs"
        else:
            reason = f"only {k} of {n} seeds meet every arm condition (need {need})"
        out.append(
            {
                "rate": g["rate"],
                "verdict": g["outcome"],
                "good_seeds": good,
                "reason": reason,
                "seeds": {str(s): _seed_states(runs, arms, float(g["rate"]), s) for s in seeds},
            }
        )
    return out


def ordered_arms(names: set[str], spec: Mapping[str, Any]) -> list[str]:
    """The arms the runs name, in the order of the rule's roles (BURST, NOBURST, CAPPED), then the rest."""
    order = [str(r["arm"]).upper() for r in spec["roles"].values()]
    key = {n.upper(): n for n in names}
    return [key[a] for a in order if a in key] + sorted(n for n in names if n.upper() not in order)


def paired_verdict(
    spec: Mapping[str, Any],
    verdict: Mapping[str, Any],
    runs: Sequence[StagedRun],
    open_loop: Sequence[tuple[str, str, float, int, dict[str, Any] | None]],
) -> dict[str, Any]:
    """The E2 verdict document from the staged verdict of `analysis.staged_analysis.analyze_staged`
    (its arms, rates, seeds and references) and the runs' open-loop summaries."""
    return {
        "test": verdict["test"],
        "rule": verdict["rule"],
        "rule_version": verdict["rule_version"],
        "verdict": verdict["verdict"],
        "rates": paired_rates(spec, verdict, runs, verdict["arms"]),
        "arms": list(verdict["arms"]),
        "registered_rates": list(verdict["registered_rates"]),
        "seeds": list(verdict["seeds"]),
        "references": verdict["references"],
        "rule_spec": dict(spec),
        "runs": [paired_run(spec, r) for r in runs],
        "open_loop": verdict_block(open_loop),
    }
