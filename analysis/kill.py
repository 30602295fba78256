"""Kill conditions of a registration, evaluated on a registered verdict (paper App. E.11).

A registration lists, as data, the outcomes that would withdraw its test's claim: the NOBURST
control not good in a third of the seeds at some rate, BURST not trapped in two thirds of the seeds
at every rate, CAPPED not recovering where BURST traps and the drain fits, a window empty or
narrower than the noise. They are judged after the runs, beside the rate verdicts, from the same
per-seed states and whether each run met its arm's expectation, as the verdict recorded them (the
paired layout of analysis/paired.py, which the code of an earlier commit also writes): nothing here
re-reads the rule. A missing or failed run can neither trigger nor clear a condition, so a condition
that depends on one is reported as undetermined (None), never as a silent False.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.paired import UNJUDGED as ABSENT


def _state(verdict: Mapping[str, Any], rate: float, seed: int, arm: str) -> str:
    for rv in verdict["rates"]:
        if abs(float(rv["rate"]) - rate) < 1e-9:
            for a, st in rv["seeds"].get(str(seed), {}).items():
                if a.upper() == arm.upper():
                    return str(st)
    return "MISSING"


def _good(verdict: Mapping[str, Any], rate: float, seed: int, arm: str) -> bool:
    """Did the run of (arm, rate, seed) meet its arm's expectation, as the verdict judged it."""
    for r in verdict.get("runs") or []:
        if (
            str(r.get("arm", "")).upper() == arm.upper()
            and r.get("seed") == seed
            and r.get("rate") is not None
            and abs(float(r["rate"]) - rate) < 1e-9
        ):
            return bool(r.get("good"))
    return False


def _arm_fails(
    kc: Mapping[str, Any],
    verdict: Mapping[str, Any],
    rates: Sequence[float],
    seeds: Sequence[int],
) -> dict[str, Any]:
    p = kc["params"]
    arm, (num, den), quant = p["arm"], p["fraction"], p.get("quantifier", "any")
    per = []
    for r in rates:
        states = {s: _state(verdict, r, s, arm) for s in seeds}
        fails = sum(1 for s, st in states.items() if st not in ABSENT and not _good(verdict, r, s, arm))
        absent = sum(1 for st in states.values() if st in ABSENT)
        n = len(seeds)
        surely = fails * den >= num * n
        maybe = (fails + absent) * den >= num * n
        per.append(
            {
                "rate": r,
                "states": {str(k): v for k, v in states.items()},
                "failing_seeds": fails,
                "absent_seeds": absent,
                "holds": True if surely else (None if maybe else False),
            }
        )
    vals = [x["holds"] for x in per]
    if quant == "any":
        trig = True if any(v is True for v in vals) else (None if any(v is None for v in vals) else False)
    else:
        trig = True if vals and all(v is True for v in vals) else (False if any(v is False for v in vals) else None)
    return {"triggered": trig, "per_rate": per}


def _capped(kc: Mapping[str, Any], verdict: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    p = kc["params"]
    per = []
    trig: bool | None = False
    for r in p.get("rates", []):
        for s in seeds:
            b, c = _state(verdict, float(r), s, p["burst_arm"]), _state(verdict, float(r), s, p["capped_arm"])
            if _good(verdict, float(r), s, p["burst_arm"]):
                if c in ABSENT:
                    holds: bool | None = None
                else:
                    holds = not _good(verdict, float(r), s, p["capped_arm"])
            else:
                holds = None if b in ABSENT else False
            per.append({"rate": r, "seed": s, "burst": b, "capped": c, "holds": holds})
            if holds is True:
                trig = True
            elif holds is None and trig is False:
                trig = None
    return {"triggered": trig, "per_seed": per, "note": "applies only at rates whose registered drain fits"}


def evaluate_kill_conditions(
    kill_conditions: Sequence[Mapping[str, Any]],
    verdict: Mapping[str, Any],
    rates: Sequence[float],
    seeds: Sequence[int],
) -> list[dict[str, Any]]:
    """Each registered kill condition with `triggered` True / False / None (undetermined) and why."""
    out = []
    for kc in kill_conditions:
        kind = kc["kind"]
        if kind == "arm_fails_fraction":
            res = _arm_fails(kc, verdict, rates, seeds)
        elif kind == "capped_not_recovered":
            res = _capped(kc, verdict, seeds)
        elif kind == "window_noise":
            frozen = kc.get("frozen") or {}
            res = {
                "triggered": frozen.get("triggered"),
                "frozen": dict(frozen),
                "note": "decided at filling from calibration alone",
            }
        else:
            res = {"triggered": None, "note": f"unknown kind {kind!r}: not evaluated"}
        out.append({"id": kc["id"], "kind": kind, "description": kc["description"], **res})
    return out
