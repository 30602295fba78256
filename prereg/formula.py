"""The registration formulas, pure: window, test rates, margin band, cap, E0b edge, CAPPED drain.

Paper §2 and App. E.4, E.5, E.11 (restated): the good state is metastable in the window
(lambda_ref, min(mu*, lambda_e)); a registration puts its two test rates one and two thirds of the
way across it, rounded to 0.05 lambda_ref, each strictly inside the margin band (1.1 low, 0.9 high),
or the fill is INCOMPLETE; the cap is the smallest grid n with mu(n) >= 0.95 mu*; the CAPPED arm is
predicted to recover at a rate only if its gate drains within 80% of the time after the burst.

Everything here is a function of numbers only (no files, no clock), so the invariants can be tested
by property and the paper's registrations reproduced from their printed inputs. Rates and the band
use decimal arithmetic: 1 + 0.3/3 is exactly 1.1, and "strictly inside (1.1, ...)" must then fail,
as it did for the paper's H200 300k cell. Every reading the paper leaves open is a parameter
(rules digest, Decisions table).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, getcontext
from typing import Literal

getcontext().prec = 40

Rounding = Literal["half_up", "half_even"]
CapAmbiguity = Literal["another_at_threshold", "within_fraction_of_cap", "not_argmax_or_another"]
EdgeReading = Literal["prefix", "largest_all_stable"]


def dec(x: float | int | str | Decimal) -> Decimal:
    """A float as the decimal it prints as (repr is the shortest round-tripping string)."""
    if isinstance(x, Decimal):
        return x
    if isinstance(x, float):
        return Decimal(repr(x))
    return Decimal(x)


def round_to_step(x: Decimal, step: Decimal, rounding: Rounding = "half_up") -> Decimal:
    """x rounded to a multiple of `step`, ties by `rounding` (Decision 17: half up)."""
    mode = ROUND_HALF_UP if rounding == "half_up" else ROUND_HALF_EVEN
    return ((x / step).quantize(Decimal(1), rounding=mode) * step).normalize()


# ---------------------------------------------------------------------------------------------
# E0b edge
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Edge:
    edge: float | None  # largest all-stable multiple under the reading; None if none is stable
    first_unstable: float | None
    monotone: bool  # no stable run above the first unstable multiple
    complete: bool  # every (multiple, seed) of the grid has a run
    missing: tuple[tuple[float, int], ...]
    reading: str


def e0b_edge(
    grid: Sequence[float], seeds: Sequence[int], runs: dict[tuple[float, int], bool], reading: EdgeReading = "prefix"
) -> Edge:
    """The from-empty edge from per-(multiple, seed) stability (Decision 2).

    prefix: the largest m such that every run at every grid multiple <= m was stable.
    largest_all_stable: the largest m at which every seed's run was stable (ignores instability
    below it; differs from prefix only on a non-monotone grid)."""
    g = sorted(grid)
    missing = tuple((m, s) for m in g for s in seeds if (m, s) not in runs)
    unstable = sorted(m for (m, _), ok in runs.items() if not ok)
    first_unstable = unstable[0] if unstable else None
    monotone = first_unstable is None or not any(ok for (m, _), ok in runs.items() if m > first_unstable)

    def all_stable(m: float) -> bool:
        return all(runs.get((m, s)) is True for s in seeds)

    edge: float | None = None
    if reading == "prefix":
        for m in g:
            if not all_stable(m):
                break
            edge = m
    else:
        ok = [m for m in g if all_stable(m)]
        edge = ok[-1] if ok else None
    return Edge(edge, first_unstable, monotone, not missing, missing, reading)


# ---------------------------------------------------------------------------------------------
# window and rates
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    low: Decimal
    high: Decimal | None  # None: no upper edge (no stable E0b multiple)
    binding: str  # which term sets the upper edge: e0b_edge | mu_star | both | none
    mu_star_ratio: float
    e0b_edge: float | None

    @property
    def empty(self) -> bool:
        return self.high is None or self.high <= self.low


def window(mu_star: float, lambda_ref: float, edge: float | None, *, low: float = 1.0, upper: str = "min") -> Window:
    """(low, min(mu*/lambda_ref, edge)) in multiples of lambda_ref, naming the binding term.

    `upper` = 'e0b' takes the E0b edge alone (the reading of App. E.5's fill sentence)."""
    ratio = mu_star / lambda_ref
    lo = dec(low)
    if upper == "e0b":
        hi = dec(edge) if edge is not None else None
        return Window(lo, hi, "e0b_edge" if edge is not None else "none", ratio, edge)
    if edge is None:
        return Window(lo, None, "none", ratio, edge)
    r, e = dec(ratio), dec(edge)
    if e < r:
        return Window(lo, e, "e0b_edge", ratio, edge)
    if r < e:
        return Window(lo, r, "mu_star", ratio, edge)
    return Window(lo, e, "both", ratio, edge)


@dataclass(frozen=True)
class PlacedRate:
    fraction: tuple[int, int]
    raw: Decimal
    multiple: Decimal
    inside: bool


@dataclass(frozen=True)
class Placement:
    band: tuple[Decimal, Decimal] | None
    rates: tuple[PlacedRate, ...]
    reasons: tuple[str, ...]  # empty iff every rate is inside the band and the rates are distinct

    @property
    def ok(self) -> bool:
        return not self.reasons


def place_rates(
    w: Window,
    *,
    fractions: Sequence[tuple[int, int]] = ((1, 3), (2, 3)),
    step: float = 0.05,
    rounding: Rounding = "half_up",
    band_low_factor: float = 1.1,
    band_high_factor: float = 0.9,
) -> Placement:
    """Rates at the given fractions across the window, rounded to `step`, checked strictly against
    the margin band (band_low_factor x low, band_high_factor x high)."""
    if w.high is None:
        return Placement(None, (), ("no upper edge: no E0b multiple was stable, so the window is empty",))
    if w.empty:
        return Placement(None, (), (f"window ({w.low}, {w.high}) is empty",))
    band = (dec(band_low_factor) * w.low, dec(band_high_factor) * w.high)
    out: list[PlacedRate] = []
    reasons: list[str] = []
    for num, den in fractions:
        raw = w.low + (w.high - w.low) * Decimal(num) / Decimal(den)
        m = round_to_step(raw, dec(step), rounding)
        inside = band[0] < m < band[1]
        out.append(PlacedRate((num, den), raw, m, inside))
        if not inside:
            reasons.append(
                f"rate {m} ({num}/{den} across the window) is not strictly inside the band ({_s(band[0])}, "
                f"{_s(band[1])})"
            )
    if band[0] >= band[1]:
        reasons.insert(0, f"the band ({_s(band[0])}, {_s(band[1])}) is empty")
    ms = [r.multiple for r in out]
    if len(set(ms)) != len(ms):
        reasons.append(f"rates {[str(x) for x in ms]} coincide after rounding")
    return Placement(band, tuple(out), tuple(reasons))


def _s(d: Decimal) -> str:
    return format(d.normalize(), "f")


# ---------------------------------------------------------------------------------------------
# cap
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cap:
    cap: int
    argmax: int
    mu_star: float
    threshold: float
    at_threshold: tuple[int, ...]  # every grid n with mu(n) >= threshold
    ambiguous: bool
    reading: str
    mu_cap: float


def cap_rule(
    curve: Sequence[tuple[int, float]],
    *,
    fraction: float = 0.95,
    ambiguity: CapAmbiguity = "another_at_threshold",
    ambiguity_fraction: float = 0.05,
) -> Cap:
    """n_cap = smallest grid n with mu(n) >= fraction x mu*; argmax n* (the smallest n at the max).

    ambiguous (Decision 3, default another_at_threshold): another grid n also reaches the threshold;
    within_fraction_of_cap: another n has mu within ambiguity_fraction of mu(n_cap);
    not_argmax_or_another: the cap is not the argmax, or another n reaches the threshold."""
    if not curve:
        raise ValueError("cap_rule: an empty curve has no cap")
    pts = sorted(curve)
    mu_star = max(m for _, m in pts)
    argmax = min(n for n, m in pts if m == mu_star)
    thr = fraction * mu_star
    at = tuple(n for n, m in pts if m >= thr)
    cap = at[0]
    mu_cap = dict(pts)[cap]
    if ambiguity == "another_at_threshold":
        amb = len(at) > 1
    elif ambiguity == "within_fraction_of_cap":
        amb = any(n != cap and abs(m - mu_cap) <= ambiguity_fraction * mu_cap for n, m in pts)
    else:
        amb = cap != argmax or len(at) > 1
    return Cap(cap, argmax, mu_star, thr, at, amb, ambiguity, mu_cap)


# ---------------------------------------------------------------------------------------------
# drain
# ---------------------------------------------------------------------------------------------
def rising_fixed_point(curve: Sequence[tuple[int, float]], lam: float) -> float | None:
    """n1 < n*: the stable fixed point mu(n1) = lam on the rising branch (None if lam >= mu*)."""
    pts = [(0.0, 0.0)] + [(float(a), float(b)) for a, b in sorted(curve)]
    mu_star = max(b for _, b in pts)
    if lam >= mu_star or lam <= 0:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if y0 <= lam <= y1 and y1 > y0:
            return x0 + (lam - y0) * (x1 - x0) / (y1 - y0)
        if y1 == mu_star:
            break
    return None


@dataclass(frozen=True)
class Drain:
    multiple: float
    lam: float
    crude_s: float  # b / (mu(c) - lam); inf when the gate never empties
    refined_s: float | None  # (n1 + b - c) / (mu(c) - lam); None when n1 is undefined
    n1: float | None
    decides: str
    drain_s: float
    budget_s: float
    fits: bool


def drain(
    mu_cap: float,
    cap: int,
    multiple: float,
    lambda_ref: float,
    burst: int,
    budget_s: float,
    curve: Sequence[tuple[int, float]],
    formula: str = "crude",
) -> Drain:
    """Predicted time for the CAPPED gate to empty after the burst (App. E.4; Decision 1)."""
    lam = multiple * lambda_ref
    gap = mu_cap - lam
    crude = burst / gap if gap > 0 else math.inf
    n1 = rising_fixed_point(curve, lam)
    refined = None
    if n1 is not None:
        refined = max(0.0, n1 + burst - cap) / gap if gap > 0 else math.inf
    decides = crude if formula == "crude" or refined is None else refined
    return Drain(multiple, lam, crude, refined, n1, formula, decides, budget_s, decides <= budget_s)


def largest_fitting_multiple(mu_cap: float, lambda_ref: float, burst: int, budget_s: float) -> float:
    """The largest rate (x lambda_ref) at which the crude drain b / (mu(c) - lam) fits the budget."""
    return (mu_cap - burst / budget_s) / lambda_ref


def drain_budget(duration: float, burst_time: float, recovered_span: float, fraction: float = 0.8) -> float:
    """fraction x the time after the burst that precedes the RECOVERED span (5760 s for E2)."""
    return fraction * (duration - burst_time - recovered_span)


def window_noise(
    width: float, lambda_ref: float, lambda_ref_se: float | None, factor: float = 2.0
) -> dict[str, object]:
    """Kill condition 4 at fill time: the window is empty, or narrower than factor x the relative
    standard error of lambda_ref (Decision 15)."""
    rel = None if lambda_ref_se is None else lambda_ref_se / lambda_ref
    noise = None if rel is None else factor * rel
    empty = not (width > 0)
    narrow = bool(noise is not None and width < noise)
    return {
        "width": width,
        "relative_se": rel,
        "noise": noise,
        "empty": empty,
        "narrower_than_noise": narrow,
        "evaluable": rel is not None,
        "triggered": empty or narrow,
    }
