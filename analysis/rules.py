"""The registered decision rules as data, and the one engine that applies them.

A rule is a spec (a dict, or YAML a registration carries): thresholds under `params`, the run
states in precedence order, each a list of conditions written as small arithmetic comparisons over
the run's statistics and the test's references, per-arm expected states, and the pass criterion.
The engine evaluates every condition of every state and keeps the first state whose conditions all
hold; it also reports each condition's truth value, so a verdict shows *why* a run is what it is
(e.g. a stuck BURST run whose backlog is flat fails the slope condition and lands INDETERMINATE).

Keeping the thresholds in the spec, not in code, is what lets a registration freeze them, and a
later rule (rescue, BASIN, TOOLSLOW) reuse the engine with its own spec.
"""

from __future__ import annotations

import ast
import copy
import math
import operator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

# The registered E2 rule (paper App. E.5, Table 6), restated as data.
E2_RULE: dict[str, Any] = {
    "name": "e2",
    "version": 1,
    "description": "E2 paired test: BURST trapped, NOBURST good, CAPPED recovered in the same seed",
    "params": {
        "rate_tolerance": 0.15,  # uncached prefill rate within +-15% of the E0a all-miss rate
        "slope_factor": 0.5,  # backlog slope must exceed this x (lam - lam_miss)
        "recovered_hit": 0.8,  # RECOVERED: hit fraction above this over the last span
        "recovered_outstanding": 20,  # RECOVERED: outstanding backlog below this over the last span
        "recovered_span": 300.0,  # seconds at the end of the run
        "outstanding_stat": "mean",  # summary of the outstanding backlog over the last span
        "backlog_bin": 10.0,  # seconds per bin of the sessions-in-system series
        "min_window": 600.0,  # shortest evaluation window the rule accepts
        "hit_threshold": 0.5,  # a turn hits if cached/prompt exceeds this
        "stuck_followup": 0.2,  # stuck: follow-up hit fraction below this over the window
    },
    # Precedence order: the first state whose conditions all hold is the run's state.
    "states": [
        {
            "name": "TRAPPED",
            "all": [
                "lam > lam_miss",
                "abs(token_rate / all_miss_rate - 1) <= rate_tolerance",
                "slope > slope_factor * (lam - lam_miss)",
            ],
        },
        {"name": "RECOVERED", "all": ["hit_last > recovered_hit", "outstanding_last < recovered_outstanding"]},
        {"name": "DRAINING", "all": ["slope < 0"]},
        {"name": "INDETERMINATE", "all": []},
    ],
    "flags": {"stuck": "followup_hit < stuck_followup"},
    # What each arm must be for its seed to count; arms are matched case-insensitively.
    "arms": {"BURST": ["TRAPPED"], "NOBURST": ["RECOVERED"], "CAPPED": ["RECOVERED"]},
    "pass": {"min_seeds": 3, "min_good_seeds": 2},
}

# Labels the per-seed strings use (Table 7 style); NOBURST's RECOVERED reads as G(ood).
STATE_LETTER = {"TRAPPED": "T", "RECOVERED": "R", "DRAINING": "D", "INDETERMINATE": "I", "FAILED": "F", "MISSING": "-", "INVALID": "X"}


class RuleError(ValueError):
    """A rule spec is malformed or refers to a quantity nobody provides."""


# ---------------------------------------------------------------------------------------------
# a tiny, safe expression evaluator
# ---------------------------------------------------------------------------------------------
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMP = {ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUN = {"abs": abs, "min": min, "max": max}


@lru_cache(maxsize=256)
def _parse(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise RuleError(f"condition {expr!r} is not a valid expression: {exc.msg}") from None
    for node in ast.walk(tree):
        ok = isinstance(
            node,
            (ast.Expression, ast.Compare, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Name, ast.Constant, ast.Call, ast.Load,
             ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, *_BIN, *_CMP),
        )
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            ok = False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUN and not node.keywords):
            ok = False
        if not ok:
            raise RuleError(f"condition {expr!r}: {type(node).__name__} is not allowed in a rule")
    return tree


def evaluate(expr: str, env: Mapping[str, Any]) -> Any:
    """Evaluate a rule condition. NaN operands make comparisons false, so missing data never passes."""

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in env:
                raise RuleError(f"condition {expr!r}: unknown quantity {n.id!r}")
            v = env[n.id]
            return float("nan") if v is None else v
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Div) and b == 0:
                return float("nan")
            return _BIN[type(n.op)](a, b)
        if isinstance(n, ast.UnaryOp):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else (+v if isinstance(n.op, ast.UAdd) else not v)
        if isinstance(n, ast.BoolOp):
            vals = [bool(ev(x)) for x in n.values]
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.Compare):
            left = ev(n.left)
            for op, right_node in zip(n.ops, n.comparators):
                right = ev(right_node)
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(n, ast.Call):
            return _FUN[n.func.id](*[ev(a) for a in n.args])  # type: ignore[union-attr]
        raise RuleError(f"condition {expr!r}: cannot evaluate {type(n).__name__}")

    return ev(_parse(expr))


# ---------------------------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------------------------
def load_rule(source: str | Path | Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The E2 rule, a YAML file or a dict, with optional parameter overrides; validated."""
    if source is None:
        spec = copy.deepcopy(E2_RULE)
    elif isinstance(source, Mapping):
        spec = copy.deepcopy(dict(source))
    else:
        spec = yaml.safe_load(Path(source).read_text())
    if overrides:
        spec["params"] = {**spec["params"], **dict(overrides)}
    validate_rule(spec)
    return spec


def validate_rule(spec: Mapping[str, Any]) -> None:
    for key in ("name", "params", "states", "arms", "pass"):
        if key not in spec:
            raise RuleError(f"rule spec: missing {key!r}")
    names = [s["name"] for s in spec["states"]]
    if len(set(names)) != len(names):
        raise RuleError(f"rule spec: duplicate state names {names}")
    if spec["states"][-1]["all"]:
        raise RuleError("rule spec: the last state must be the unconditional fallback (empty 'all')")
    for s in spec["states"]:
        for c in s["all"]:
            _parse(c)
    for f in spec.get("flags", {}).values():
        _parse(f)
    for arm, states in spec["arms"].items():
        bad = [x for x in states if x not in names]
        if bad:
            raise RuleError(f"rule spec: arm {arm} expects unknown state(s) {bad}")


# ---------------------------------------------------------------------------------------------
# run level
# ---------------------------------------------------------------------------------------------
@dataclass
class RunVerdict:
    """The state of one run and the evidence behind it."""

    arm: str
    rate: float
    seed: int
    state: str  # a rule state, or FAILED / MISSING / INVALID
    good: bool  # the arm's condition holds
    conditions: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    run_dir: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "rate": self.rate,
            "seed": self.seed,
            "state": self.state,
            "good": self.good,
            "conditions": {k: [{"condition": c, "holds": h} for c, h in v] for k, v in self.conditions.items()},
            "flags": self.flags,
            "stats": {k: _json_num(v) for k, v in self.stats.items()},
            "reason": self.reason,
            "run_dir": self.run_dir,
        }


def _json_num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def arm_expectation(spec: Mapping[str, Any], arm: str) -> list[str]:
    for name, states in spec["arms"].items():
        if name.upper() == arm.upper():
            return list(states)
    raise RuleError(f"rule {spec['name']}: no expectation for arm {arm!r} (known: {sorted(spec['arms'])})")


def classify(stats: Mapping[str, Any], refs: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[str, dict[str, list[tuple[str, bool]]], dict[str, bool]]:
    """Apply the states in precedence order; returns (state, every condition's value, flags)."""
    env = {**spec["params"], **refs, **stats}
    conds: dict[str, list[tuple[str, bool]]] = {}
    state = None
    for s in spec["states"]:
        vals = [(c, bool(evaluate(c, env))) for c in s["all"]]
        conds[s["name"]] = vals
        if state is None and all(v for _, v in vals):
            state = s["name"]
    flags = {k: bool(evaluate(e, env)) for k, e in spec.get("flags", {}).items()}
    assert state is not None  # the last state is unconditional
    return state, conds, flags


def judge_run(
    arm: str,
    rate: float,
    seed: int,
    stats: Mapping[str, Any] | None,
    refs: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    status: str = "complete",
    reason: str = "",
    run_dir: str = "",
) -> RunVerdict:
    """One run's verdict. A failed or missing run, or one whose window is too short, never counts."""
    expect = arm_expectation(spec, arm)
    if status == "missing" or stats is None:
        return RunVerdict(arm, rate, seed, "MISSING", False, reason=reason or "no run", run_dir=run_dir)
    if status != "complete":
        return RunVerdict(arm, rate, seed, "FAILED", False, stats=dict(stats), reason=reason or f"run status {status}", run_dir=run_dir)
    wlen = float(stats.get("window_len", 0.0))
    if wlen + 1e-9 < float(spec["params"].get("min_window", 0.0)):
        return RunVerdict(arm, rate, seed, "INVALID", False, stats=dict(stats), reason=f"window {wlen:g} s shorter than min_window", run_dir=run_dir)
    state, conds, flags = classify(stats, refs, spec)
    return RunVerdict(arm, rate, seed, state, state in expect, conds, flags, dict(stats), reason, run_dir)


# ---------------------------------------------------------------------------------------------
# test level
# ---------------------------------------------------------------------------------------------
@dataclass
class RateVerdict:
    rate: float
    verdict: str  # PASS | FAIL | INCOMPLETE
    good_seeds: list[int]
    seeds: dict[int, dict[str, str]]  # seed -> arm -> state
    reason: str


def judge_rate(rate: float, runs: Sequence[RunVerdict], arms: Sequence[str], seeds: Sequence[int], spec: Mapping[str, Any]) -> RateVerdict:
    """PASS iff at least min_good_seeds of the registered seeds (at least min_seeds of them) have
    every arm's condition met in that seed. Missing or failed runs make their seed fail; when they
    are the only reason a rate does not pass, the rate is INCOMPLETE rather than FAIL."""
    need = int(spec["pass"]["min_good_seeds"])
    min_seeds = int(spec["pass"]["min_seeds"])
    by = {(r.arm.upper(), r.seed): r for r in runs if r.rate == rate}
    table: dict[int, dict[str, str]] = {}
    good: list[int] = []
    undecided = 0
    for seed in seeds:
        rs = [by.get((arm.upper(), seed)) for arm in arms]
        table[seed] = {arm: (r.state if r else "MISSING") for arm, r in zip(arms, rs)}
        absent = [r is None or r.state in ("MISSING", "FAILED") for r in rs]
        if all(r is not None and r.good for r in rs):
            good.append(seed)
        elif any(absent) and all(a or (r is not None and r.good) for a, r in zip(absent, rs)):
            undecided += 1
    if len(seeds) < min_seeds:
        return RateVerdict(rate, "INCOMPLETE", good, table, f"{len(seeds)} seeds registered; the rule needs at least {min_seeds}")
    if len(good) >= need:
        return RateVerdict(rate, "PASS", good, table, f"{len(good)} of {len(seeds)} seeds meet every arm condition")
    if len(good) + undecided >= need:
        return RateVerdict(rate, "INCOMPLETE", good, table, f"{len(good)} of {len(seeds)} seeds pass; {undecided} more could with their missing or failed runs")
    return RateVerdict(rate, "FAIL", good, table, f"only {len(good)} of {len(seeds)} seeds meet every arm condition (need {need})")


def judge_test(
    runs: Sequence[RunVerdict], arms: Sequence[str], rates: Sequence[float], seeds: Sequence[int], spec: Mapping[str, Any]
) -> dict[str, Any]:
    """The test verdict: per rate, and overall PASS only if every rate passes."""
    per = [judge_rate(r, runs, arms, seeds, spec) for r in rates]
    overall = "PASS" if all(p.verdict == "PASS" for p in per) else ("FAIL" if any(p.verdict == "FAIL" for p in per) else "INCOMPLETE")
    return {
        "rule": spec["name"],
        "rule_version": spec.get("version"),
        "verdict": overall,
        "rates": [
            {"rate": p.rate, "verdict": p.verdict, "good_seeds": p.good_seeds, "reason": p.reason,
             "seeds": {str(k): v for k, v in p.seeds.items()}}
            for p in per
        ],
    }
