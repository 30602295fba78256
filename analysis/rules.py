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

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analysis.expr import RuleError, evaluate, parse
from analysis.stages import judge_staged, judge_staged_run, validate_staged
from harness.config import check_finite

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
STATE_LETTER = {
    "TRAPPED": "T",
    "RECOVERED": "R",
    "DRAINING": "D",
    "INDETERMINATE": "I",
    "FAILED": "F",
    "MISSING": "-",
    "INVALID": "X",
}


# The condition language (and RuleError) live in analysis.expr; re-exported here for callers.
_parse = parse


# ---------------------------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------------------------
RULESPEC_DIR = Path(__file__).resolve().parent / "rulespecs"
# A project's own rules (e.g. a scaled cell's, configs/rules/e2-cpu.yaml) load by name too, after
# the built-in ones: `analyze --rule e2-cpu` names the same spec a test config names.
CONFIG_RULE_DIR = Path(__file__).resolve().parent.parent / "configs" / "rules"
BUILTIN_RULES: dict[str, dict[str, Any]] = {"e2": E2_RULE}


def rule_names() -> list[str]:
    """Every rule loadable by name: the built-in E2 rule, the specs under analysis/rulespecs/ and
    those under configs/rules/."""
    return sorted({*BUILTIN_RULES, *(p.stem for d in (RULESPEC_DIR, CONFIG_RULE_DIR) for p in d.glob("*.yaml"))})


def _read_spec(source: str | Path) -> dict[str, Any]:
    p = Path(source)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as exc:
            raise RuleError(f"rule spec {str(source)!r}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise RuleError(f"rule spec {p}: not valid YAML: {exc}") from None
    elif str(source) in BUILTIN_RULES:
        return copy.deepcopy(BUILTIN_RULES[str(source)])
    elif (RULESPEC_DIR / f"{source}.yaml").is_file():
        return _read_spec(RULESPEC_DIR / f"{source}.yaml")
    elif (RULESPEC_DIR / "bases" / f"{source}.yaml").is_file():  # shared pieces, for `extends` only
        return _read_spec(RULESPEC_DIR / "bases" / f"{source}.yaml")
    elif (CONFIG_RULE_DIR / f"{source}.yaml").is_file():
        return _read_spec(CONFIG_RULE_DIR / f"{source}.yaml")
    else:
        raise RuleError(f"rule {str(source)!r}: no such file and no such rule; known rules: {rule_names()}")
    if not isinstance(data, dict):
        raise RuleError(f"rule spec {p}: expected a mapping at the top level, got {type(data).__name__}")
    check_finite(data, f"rule spec {p}", RuleError)
    return data


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge for `extends`: mappings merge key by key (the extending spec wins), anything else
    (lists, strings, numbers) is replaced whole, so an extending spec can restate a list of outcomes."""
    out = copy.deepcopy(dict(base))
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _resolve(spec: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    ext = spec.pop("extends", None)
    if not ext:
        return spec
    bases = [ext] if isinstance(ext, str) else list(ext)
    merged: dict[str, Any] = {}
    for b in bases:
        if b in seen:
            raise RuleError(f"rule spec {spec.get('name')!r}: circular extends through {b!r}")
        merged = _merge(merged, _resolve(_read_spec(b), (*seen, b)))
    merged.pop("name", None)
    merged.pop("description", None)
    out = _merge(merged, spec)
    out["based_on"] = [*merged.get("based_on", []), *bases]
    return out


def load_rule(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A rule spec, resolved and validated: the E2 rule (None or "e2"), a rule by name
    (analysis/rulespecs/<name>.yaml), a YAML file, or a dict (e.g. the one a registration froze).

    `extends` is resolved into a self-contained spec (what a registration should freeze), and
    `overrides` replace parameters, which must already exist (a misspelt override is an error, not a
    silently unused threshold)."""
    if source is None:
        spec = copy.deepcopy(E2_RULE)
    elif isinstance(source, Mapping):
        spec = copy.deepcopy(dict(source))
    else:
        spec = _read_spec(source)
    spec = _resolve(spec)
    if overrides:
        check_finite(dict(overrides), f"rule {spec.get('name')!r}: overrides", RuleError)
        unknown = sorted(set(overrides) - set(spec.get("params", {})))
        if unknown:
            raise RuleError(
                f"rule {spec.get('name')!r}: override(s) {unknown} name no parameter; parameters are {sorted(spec.get('params', {}))}"
            )
        spec["params"] = {**spec["params"], **dict(overrides)}
    validate_rule(spec)
    return spec


def is_staged(spec: Mapping[str, Any]) -> bool:
    """True for the rule families judged by analysis.engine (roles, seeds, groups, test);
    False for the paired-test form of the E2 rule (arms' expected states and a seed count)."""
    return "roles" in spec


def validate_rule(spec: Mapping[str, Any]) -> None:
    if is_staged(spec):
        validate_staged(spec)
        return
    if "group" in spec or "seed" in spec:
        raise RuleError(
            f"rule spec {spec.get('name')!r}: has a group/seed stage but no 'roles' (which runs play which part)"
        )
    for key in ("name", "params", "states", "arms", "pass"):
        if key not in spec:
            raise RuleError(
                f"rule spec {spec.get('name')!r}: missing {key!r} (a paired-test rule needs name, params, states, arms, pass)"
            )
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


def classify(
    stats: Mapping[str, Any], refs: Mapping[str, Any], spec: Mapping[str, Any]
) -> tuple[str, dict[str, list[tuple[str, bool]]], dict[str, bool]]:
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
        return RunVerdict(
            arm,
            rate,
            seed,
            "FAILED",
            False,
            stats=dict(stats),
            reason=reason or f"run status {status}",
            run_dir=run_dir,
        )
    wlen = float(stats.get("window_len", 0.0))
    if wlen + 1e-9 < float(spec["params"].get("min_window", 0.0)):
        return RunVerdict(
            arm,
            rate,
            seed,
            "INVALID",
            False,
            stats=dict(stats),
            reason=f"window {wlen:g} s shorter than min_window",
            run_dir=run_dir,
        )
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


def judge_rate(
    rate: float, runs: Sequence[RunVerdict], arms: Sequence[str], seeds: Sequence[int], spec: Mapping[str, Any]
) -> RateVerdict:
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
        return RateVerdict(
            rate, "INCOMPLETE", good, table, f"{len(seeds)} seeds registered; the rule needs at least {min_seeds}"
        )
    if len(good) >= need:
        return RateVerdict(rate, "PASS", good, table, f"{len(good)} of {len(seeds)} seeds meet every arm condition")
    if len(good) + undecided >= need:
        return RateVerdict(
            rate,
            "INCOMPLETE",
            good,
            table,
            f"{len(good)} of {len(seeds)} seeds pass; {undecided} more could with their missing or failed runs",
        )
    return RateVerdict(
        rate, "FAIL", good, table, f"only {len(good)} of {len(seeds)} seeds meet every arm condition (need {need})"
    )


def judge_test(
    runs: Sequence[RunVerdict],
    arms: Sequence[str],
    rates: Sequence[float],
    seeds: Sequence[int],
    spec: Mapping[str, Any],
) -> dict[str, Any]:
    """The test verdict: per rate, and overall PASS only if every rate passes."""
    per = [judge_rate(r, runs, arms, seeds, spec) for r in rates]
    overall = (
        "PASS"
        if all(p.verdict == "PASS" for p in per)
        else ("FAIL" if any(p.verdict == "FAIL" for p in per) else "INCOMPLETE")
    )
    return {
        "rule": spec["name"],
        "rule_version": spec.get("version"),
        "verdict": overall,
        "rates": [
            {
                "rate": p.rate,
                "verdict": p.verdict,
                "good_seeds": p.good_seeds,
                "reason": p.reason,
                "seeds": {str(k): v for k, v in p.seeds.items()},
            }
            for p in per
        ],
    }


# ---------------------------------------------------------------------------------------------
# staged families from tabulated quantities
# ---------------------------------------------------------------------------------------------
def judge_quantities(
    spec: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    rates: Sequence[float],
    seeds: Sequence[int],
) -> tuple[dict[str, Any], list[Any]]:
    """Judge a staged spec from per-run quantities instead of run directories: each row is
    {arm, rate, seed, quantities, status?}. This is how a paper's printed per-run numbers are
    scored (tests/data/paper/), and how a reviewer re-scores a table without the raw records; a
    quantity the table lacks reads as NaN (so no condition on it holds).
    Returns (verdict, staged runs)."""
    runs = [
        judge_staged_run(
            spec,
            str(r["arm"]),
            float(r["rate"]),
            int(r["seed"]),
            r.get("quantities"),
            status=r.get("status", "complete"),
            missing_as_nan=True,
        )
        for r in rows
    ]
    verdict = judge_staged(spec, runs, rates=rates, seeds=seeds, missing_as_nan=True)
    verdict["runs"] = [r.to_json() for r in runs]
    return verdict, runs
