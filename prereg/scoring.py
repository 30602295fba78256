"""Scoring frozen predictions against outcomes: hit or miss under each prediction's own declaration,
Brier and log scores for probabilities, and rule probabilities from per-seed probabilities.

Why it is built this way: the declaration frozen inside the prediction file decides hit or miss
(rules-digest Decisions, AMB-20), so the scorer has no tolerances of its own. A probabilistic
prediction "calls" the side it gives more than one half (a probability of exactly one half makes no
call); a categorical one calls its modal category. A rule probability is recomputed here from the
per-run probabilities it names, assuming independent runs (each run its own seed and plan), so a
rule probability printed beside its per-seed layer can be checked, not trusted.

Outcomes come from an `Outcomes` table (built from run directories by `prereg.outcomes`, or read
from a data file transcribed from a paper); the scorer only looks values up by (quantity, about).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prereg.predictions import MARGIN_LABELS, Prediction, PredictionFile, leaves_of

MISSING = object()


# ---------------------------------------------------------------------------------------------
# probability arithmetic
# ---------------------------------------------------------------------------------------------
def at_least_probability(ps: Sequence[float], k: int) -> float:
    """P(at least k of independent events with probabilities ps happen) (Poisson-binomial)."""
    dist = [1.0]  # dist[j] = P(j events so far)
    for p in ps:
        nxt = [0.0] * (len(dist) + 1)
        for j, q in enumerate(dist):
            nxt[j] += q * (1.0 - p)
            nxt[j + 1] += q * p
        dist = nxt
    return float(min(1.0, max(0.0, sum(dist[k:]))))


def clause_probability(clause: Mapping[str, Any], leaf_p: Mapping[str, float]) -> float:
    """P(clause holds) for a clause tree whose sub-clauses involve disjoint, independent runs."""
    if "prediction" in clause:
        p = float(leaf_p[clause["prediction"]])
        return p if clause["is"] else 1.0 - p
    if "at_least" in clause:
        return at_least_probability([clause_probability(c, leaf_p) for c in clause["of"]], int(clause["at_least"]))
    subs = [clause_probability(c, leaf_p) for c in clause.get("all", clause.get("any", []))]
    if "all" in clause:
        return float(math.prod(subs))
    return 1.0 - float(math.prod(1.0 - s for s in subs))


def clause_outcome(clause: Mapping[str, Any], leaf_o: Mapping[str, bool | None]) -> bool | None:
    """Whether the clause held, from the leaves' realized events (None when a needed leaf is unknown)."""
    if "prediction" in clause:
        o = leaf_o.get(clause["prediction"])
        return None if o is None else (o if clause["is"] else not o)
    vals = [clause_outcome(c, leaf_o) for c in clause.get("of", clause.get("all", clause.get("any", [])))]
    known = [v for v in vals if v is not None]
    if "at_least" in clause:
        k = int(clause["at_least"])
        if sum(known) >= k:
            return True
        if sum(known) + (len(vals) - len(known)) < k:
            return False
        return None
    if "all" in clause:
        return False if False in known else (True if len(known) == len(vals) else None)
    return True if True in known else (False if len(known) == len(vals) else None)


def brier(p: float, happened: bool) -> float:
    return (p - (1.0 if happened else 0.0)) ** 2


def log_score(p: float, happened: bool) -> float:
    """ln P(what happened); -inf when the prediction gave it probability 0."""
    q = p if happened else 1.0 - p
    return math.log(q) if q > 0 else -math.inf


# ---------------------------------------------------------------------------------------------
# outcomes
# ---------------------------------------------------------------------------------------------
def _norm(v: Any) -> Any:
    return v.upper() if isinstance(v, str) else v


class Outcomes:
    """Realized values by (quantity, about-key); `sources` says where each came from."""

    def __init__(self) -> None:
        self._v: dict[tuple[str, tuple[Any, ...]], Any] = {}
        self._by_id: dict[str, Any] = {}
        self.sources: dict[tuple[str, tuple[Any, ...]], str] = {}
        self.notes: list[str] = []

    def put(self, quantity: str, about_key: tuple[Any, ...], value: Any, source: str = "") -> None:
        self._v[(quantity, about_key)] = value
        self.sources[(quantity, about_key)] = source

    def put_id(self, pid: str, value: Any) -> None:
        self._by_id[pid] = value

    def merge(self, other: Outcomes) -> None:
        """Add another table's outcomes (the other's win where both have one)."""
        self._v.update(other._v)
        self._by_id.update(other._by_id)
        self.sources.update(other.sources)
        self.notes += other.notes

    def get(self, p: Prediction) -> Any:
        if p.id in self._by_id:
            return self._by_id[p.id]
        return self._v.get((p.quantity, p.about.key()), MISSING)

    def __len__(self) -> int:
        return len(self._v) + len(self._by_id)


# ---------------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------------
@dataclass
class Scored:
    """One prediction against its outcome."""

    id: str
    kind: str
    quantity: str
    about: str
    layer: str
    predicted: str  # human-readable
    outcome: Any
    result: str  # hit | miss | no call | no outcome
    error: float | None = None
    probability: float | None = None  # P(event) or P(rule holds), as scored
    stated_probability: float | None = None  # a rule probability as the file stated it
    brier: float | None = None
    log_score: float | None = None
    detail: str = ""
    blindness: str | None = None
    margin_label: str | None = None  # robust | knife-edge | unjudged; None without margins
    margin: float | None = None  # the smallest flip margin (a relative change)
    margin_detail: str | None = None  # each knob's flipping sides against its noise

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if isinstance(d["log_score"], float) and math.isinf(d["log_score"]):
            d["log_score"] = "-inf"
        return d


@dataclass
class Score:
    """Every prediction of one file, scored, with per-layer summaries."""

    name: str
    scored: list[Scored]
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the same summaries over robust and knife-edge predictions apart (empty when none has margins)
    by_margin: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def hits(self) -> list[Scored]:
        return [s for s in self.scored if s.result == "hit"]

    @property
    def misses(self) -> list[Scored]:
        return [s for s in self.scored if s.result == "miss"]


def _event_happened(p: Prediction, outcome: Any) -> bool:
    return bool(_norm(outcome) == _norm(p.payload["event"]["equals"]))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _tolerance(p: Prediction, v: float) -> tuple[float, float, str]:
    """(low, high, text) of the accepted interval for a value prediction whose (transformed) value is v."""
    tol = p.payload["tolerance"]
    if "abs" in tol:
        return v - tol["abs"], v + tol["abs"], f"±{_fmt(tol['abs'])}"
    if "rel" in tol:
        d = abs(v) * tol["rel"]
        return v - d, v + d, f"±{100 * tol['rel']:g}%"
    if "rel_of_offset" in tol:
        d = abs(v - tol["origin"]) * tol["rel_of_offset"]
        return v - d, v + d, f"±{tol['rel_of_offset']:g}·(v−{_fmt(tol['origin'])}) = ±{_fmt(d)}"
    lo, hi = tol["interval"]
    return float(lo), float(hi), f"in [{_fmt(lo)}, {_fmt(hi)}]"


def _predicted_value(p: Prediction) -> float:
    v = float(p.payload["value"])
    tr = p.payload.get("transform")
    if tr:
        v = tr["origin"] + tr["factor"] * (v - tr["origin"])
    return v


def score_file(pf: PredictionFile, outcomes: Outcomes) -> Score:
    """Score every prediction of `pf` against `outcomes` under its own declaration."""
    by_id = pf.by_id()
    out: list[Scored] = []
    for p in pf.predictions:
        s = _score_one(p, outcomes, by_id)
        if p.margin is not None:
            s.margin_label, s.margin, s.margin_detail = p.margin_label, float(p.margin["margin"]), margin_text(p.margin)
        out.append(s)
    sc = Score(pf.name, out)
    sc.summary = summarize(out)
    sc.by_margin = summarize_by_margin(out)
    return sc


def _pct(v: Any) -> str:
    return "none up to the largest change" if v is None else f"{100 * float(v):.3g}%"


def margin_text(m: Mapping[str, Any]) -> str:
    """A margin block in words: per knob, the change that flips each side and the noise."""
    parts = []
    for knob in ("speed", "lambda_ref"):
        k = m.get(knob)
        if not isinstance(k, Mapping):
            continue
        sides = ", ".join(f"{side} {_pct(v)}" for side, v in k.items() if side != "noise")
        nz = k.get("noise")
        parts.append(f"{knob}: {sides} (noise {'unknown' if nz is None else _pct(nz)})")
    return "; ".join(parts)


def _score_one(p: Prediction, outcomes: Outcomes, by_id: Mapping[str, Prediction]) -> Scored:
    base: dict[str, Any] = {
        "id": p.id,
        "kind": p.kind,
        "quantity": p.quantity,
        "about": p.about.label(),
        "layer": p.layer,
    }
    if p.kind == "rule_probability":
        return _score_rule(p, outcomes, by_id, base)
    o = outcomes.get(p)
    if p.kind == "probability":
        prob = float(p.payload["probability"])
        pred = f"P({p.quantity} = {_fmt(p.payload['event']['equals'])}) = {prob:.3g}"
        if o is MISSING:
            return Scored(**base, predicted=pred, outcome=None, result="no outcome", probability=prob)
        happened = _event_happened(p, o)
        result = "no call" if prob == 0.5 else ("hit" if (prob > 0.5) == happened else "miss")
        return Scored(
            **base,
            predicted=pred,
            outcome=o,
            result=result,
            probability=prob,
            brier=brier(prob, happened),
            log_score=log_score(prob, happened),
            detail="event happened" if happened else "event did not happen",
        )
    if p.kind == "categorical":
        ps = {str(k): float(v) for k, v in p.payload["probabilities"].items()}
        top = max(ps.values())
        modal = [k for k, v in ps.items() if v == top]
        pred = ", ".join(f"{k} {v:.3g}" for k, v in ps.items())
        if o is MISSING:
            return Scored(**base, predicted=pred, outcome=None, result="no outcome")
        oc = _norm(o)
        q = next((v for k, v in ps.items() if _norm(k) == oc), 0.0)
        b = sum((v - (1.0 if _norm(k) == oc else 0.0)) ** 2 for k, v in ps.items()) + (
            0.0 if any(_norm(k) == oc for k in ps) else 1.0
        )
        result = "no call" if len(modal) > 1 else ("hit" if _norm(modal[0]) == oc else "miss")
        return Scored(
            **base,
            predicted=pred,
            outcome=o,
            result=result,
            probability=q,
            brier=b,
            log_score=math.log(q) if q > 0 else -math.inf,
            detail=f"modal call {'/'.join(modal)}",
        )
    if p.kind == "call":
        pred = f"{p.quantity} = {_fmt(p.payload['value'])}"
        if o is MISSING:
            return Scored(**base, predicted=pred, outcome=None, result="no outcome")
        return Scored(
            **base, predicted=pred, outcome=o, result="hit" if _norm(o) == _norm(p.payload["value"]) else "miss"
        )
    if p.kind == "value":
        v = _predicted_value(p)
        lo, hi, text = _tolerance(p, v)
        pred = f"{_fmt(v)} {text}" + (
            f" (from {_fmt(p.payload['value'])} transformed)" if p.payload.get("transform") else ""
        )
        if o is MISSING or o is None or (isinstance(o, float) and math.isnan(o)):
            return Scored(**base, predicted=pred, outcome=None, result="no outcome")
        x = float(o)
        return Scored(
            **base,
            predicted=pred,
            outcome=x,
            result="hit" if lo <= x <= hi else "miss",
            error=x - v,
            detail=f"accepted [{_fmt(lo)}, {_fmt(hi)}]",
        )
    # closest
    v = float(p.payload["value"])
    comps = {str(k): float(c) for k, c in p.payload["comparators"].items()}
    pred = f"{_fmt(v)} vs " + ", ".join(f"{k} {_fmt(c)}" for k, c in comps.items())
    if o is MISSING or o is None:
        return Scored(**base, predicted=pred, outcome=None, result="no outcome")
    x = float(o)
    d_pred = abs(x - v)
    nearest = min(comps, key=lambda k: abs(x - comps[k]))
    ok = d_pred < abs(x - comps[nearest])
    return Scored(
        **base,
        predicted=pred,
        outcome=x,
        result="hit" if ok else "miss",
        error=x - v,
        detail=f"|err| {_fmt(d_pred)} vs nearest comparator {nearest} {_fmt(abs(x - comps[nearest]))}",
    )


def _score_rule(p: Prediction, outcomes: Outcomes, by_id: Mapping[str, Prediction], base: dict[str, Any]) -> Scored:
    rule = p.payload["rule"]
    ids = leaves_of(rule)
    leaf_p = {i: float(by_id[i].payload["probability"]) for i in ids}
    prob = clause_probability(rule, leaf_p)
    stated = p.payload.get("probability")
    leaf_o: dict[str, bool | None] = {}
    for i in ids:
        o = outcomes.get(by_id[i])
        leaf_o[i] = None if o is MISSING else _event_happened(by_id[i], o)
    held = outcomes.get(p)
    held = clause_outcome(rule, leaf_o) if held is MISSING else bool(held)
    pred = f"P(rule holds) = {prob:.3g}" + (f" (stated {stated:.3g})" if stated is not None else "")
    if held is None:
        return Scored(
            **base, predicted=pred, outcome=None, result="no outcome", probability=prob, stated_probability=stated
        )
    result = "no call" if prob == 0.5 else ("hit" if (prob > 0.5) == held else "miss")
    return Scored(
        **base,
        predicted=pred,
        outcome=held,
        result=result,
        probability=prob,
        stated_probability=stated,
        brier=brier(prob, held),
        log_score=log_score(prob, held),
        detail="rule held" if held else "rule did not hold",
    )


def summarize_by_margin(scored: Iterable[Scored]) -> dict[str, dict[str, Any]]:
    """`summarize` over robust, knife-edge and unjudged predictions apart (those with margins)."""
    with_m = [s for s in scored if s.margin_label is not None]
    got = summarize(with_m, key=lambda s: str(s.margin_label))
    return {k: got[k] for k in sorted(got, key=lambda k: MARGIN_LABELS.index(k) if k in MARGIN_LABELS else 99)}


def summarize(scored: Iterable[Scored], key: Callable[[Scored], str] | None = None) -> dict[str, dict[str, Any]]:
    """Per layer (or per `key(scored)`): counts of hits, misses, no call, no outcome; mean Brier and
    log score per kind."""
    out: dict[str, dict[str, Any]] = {}
    for s in scored:
        d = out.setdefault(
            s.layer if key is None else key(s),
            {"n": 0, "hit": 0, "miss": 0, "no call": 0, "no outcome": 0, "_b": {}, "_l": {}},
        )
        d["n"] += 1
        d[s.result] += 1
        if s.brier is not None:
            d["_b"].setdefault(s.kind, []).append(s.brier)
        if s.log_score is not None:
            d["_l"].setdefault(s.kind, []).append(s.log_score)
    for d in out.values():
        b, lg = d.pop("_b"), d.pop("_l")
        d["brier"] = {k: sum(v) / len(v) for k, v in b.items()}
        d["brier_n"] = {k: len(v) for k, v in b.items()}
        d["log_score"] = {k: (sum(v) / len(v) if all(math.isfinite(x) for x in v) else "-inf") for k, v in lg.items()}
    return out
