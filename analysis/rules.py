"""The registered decision rules as data: loading a spec by name or file, resolving `extends`,
overrides, and scoring tabulated per-run quantities with the staged engine.

A rule is a spec (YAML under analysis/rulespecs/ or configs/rules/, or the dict a registration
froze): thresholds under `params`, conditions written as small arithmetic comparisons over a run's
quantities and the test's references, and the stages that combine runs into seeds, groups and a
test verdict (analysis/stages.py). Every family, the paired test E2 included, is judged by that one
engine; keeping the thresholds in the spec, not in code, is what lets a registration freeze them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from analysis.rulecheck import validate_staged
from analysis.stages import StagedRun, judge_staged, judge_staged_run
from harness.config import check_finite
from harness.config.files import safe_load
from harness.errors import RuleError

# ---------------------------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------------------------
RULESPEC_DIR = Path(__file__).resolve().parent / "rulespecs"
# A project's own rules (e.g. a scaled cell's, configs/rules/e2-cpu.yaml) load by name too, after
# those of analysis/rulespecs/: `analyze --rule e2-cpu` names the same spec a test config names.
CONFIG_RULE_DIR = Path(__file__).resolve().parent.parent / "configs" / "rules"
IDENTITY = ("name", "version", "family", "description")
DEFAULT_RULE = "e2"  # a test that names no rule is the paired test E2 (harness.config.TestConfig.rule)


def rule_names() -> list[str]:
    """Every rule loadable by name: the specs under analysis/rulespecs/ and those under configs/rules/."""
    return sorted({p.stem for d in (RULESPEC_DIR, CONFIG_RULE_DIR) for p in d.glob("*.yaml")})


def _read_spec(source: str | Path) -> dict[str, Any]:
    p = Path(source)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        try:
            data = safe_load(p.read_text())
        except OSError as exc:
            raise RuleError(f"rule spec {str(source)!r}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise RuleError(f"rule spec {p}: not valid YAML: {exc}") from None
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
    # the rule's identity first, as the spec that extends writes it (a registration is read top-down)
    head = {k: out.pop(k) for k in IDENTITY if k in out}
    return {**head, **out}


def load_rule(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A rule spec, resolved and validated: a rule by name (analysis/rulespecs/<name>.yaml, then
    configs/rules/<name>.yaml; None is the default rule, E2), a YAML file, or a dict (e.g. the one a
    registration froze).

    `extends` is resolved into a self-contained spec (what a registration should freeze), and
    `overrides` replace parameters, which must already exist (a misspelt override is an error, not a
    silently unused threshold)."""
    if isinstance(source, Mapping):
        spec = copy.deepcopy(dict(source))
    else:
        spec = _read_spec(DEFAULT_RULE if source is None else source)
    spec = _resolve(spec)
    if overrides:
        check_finite(dict(overrides), f"rule {spec.get('name')!r}: overrides", RuleError)
        unknown = sorted(set(overrides) - set(spec.get("params", {})))
        if unknown:
            raise RuleError(
                f"rule {spec.get('name')!r}: override(s) {unknown} name no parameter; "
                f"parameters are {sorted(spec.get('params', {}))}"
            )
        spec["params"] = {**spec["params"], **dict(overrides)}
    validate_rule(spec)
    return spec


def is_paired_form(spec: Mapping[str, Any]) -> bool:
    """A rule frozen in the paired form of the registrations made before E2 became a staged spec
    (per-arm states under `arms`, a `pass` block, no roles). Only the code of such a registration's
    own commit judges it (review/registered.py); this code reads it for nothing but that hand-off."""
    return "roles" not in spec and isinstance(spec.get("arms"), Mapping) and "pass" in spec


def validate_rule(spec: Mapping[str, Any]) -> None:
    """Refuse a spec this code cannot judge, naming the field (analysis/rulecheck.py)."""
    if is_paired_form(spec):
        raise RuleError(
            f"rule spec {spec.get('name')!r}: the paired form (arms, pass) of registrations made before the rule "
            "became a staged spec; only the code of the registration's own commit judges it"
        )
    validate_staged(spec)


def arm_expectations(spec: Mapping[str, Any]) -> dict[str, list[str]]:
    """{ARM: the labels its run must show} for the roles that `expect` one (E2: BURST TRAPPED,
    NOBURST and CAPPED RECOVERED); empty for a family that states no per-arm expectation."""
    out: dict[str, list[str]] = {}
    for role in spec.get("roles", {}).values():
        if "expect" in role:
            for a in [role["arm"]] if isinstance(role["arm"], str) else role["arm"]:
                out[str(a).upper()] = list(role["expect"])
    return out


def arm_expectation(spec: Mapping[str, Any], arm: str) -> list[str]:
    """The labels `arm`'s run must show for its seed to count (matched case-insensitively)."""
    exp = arm_expectations(spec)
    if arm.upper() not in exp:
        raise RuleError(f"rule {spec.get('name')!r}: no expectation for arm {arm!r} (known: {sorted(exp)})")
    return exp[arm.upper()]


# ---------------------------------------------------------------------------------------------
# staged families from tabulated quantities
# ---------------------------------------------------------------------------------------------
def judge_quantities(
    spec: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    rates: Sequence[float],
    seeds: Sequence[int],
    arms: Sequence[str] | None = None,
) -> tuple[dict[str, Any], list[StagedRun]]:
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
    verdict = judge_staged(spec, runs, rates=rates, seeds=seeds, arms=arms, missing_as_nan=True)
    verdict["runs"] = [r.to_json() for r in runs]
    return verdict, runs
