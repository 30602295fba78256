"""The condition language and the rule specs: what is allowed, how missing data reads, how specs
load by name, resolve `extends`, take overrides, and refuse malformed input with a clear message."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from analysis.expr import Env, Evaluator, RuleError, evaluate, names, truth
from analysis.rules import load_rule, rule_names

NAN = float("nan")


def test_strings_dotted_names_and_conditionals() -> None:
    env = {"cut.endpoint": "STUCK", "a": 2.0, "arm.gate.t_on": 1800.0, "mode": "control", "x.y": 3.0, "z": 1.0}
    assert evaluate("cut.endpoint == 'STUCK'", env) is True
    assert evaluate("arm.gate.t_on - 300", env) == 1500.0
    assert evaluate("x.y if mode == 'control' else z", env) == 3.0
    assert evaluate("a ** 2 + ceil(2.2) + floor(-0.5)", env) == 4.0 + 3.0 - 1.0
    assert names("abs(cut.s - cut.pred.slope) < min(a, b.c)") == {"cut.s", "cut.pred.slope", "a", "b.c"}


def test_missing_data_never_passes() -> None:
    env = {"x": None, "s": "STUCK", "one": 1.0, "zero": 0.0}
    assert evaluate("x > 0", env) is False and evaluate("x <= 0", env) is False
    assert evaluate("not (x > 0)", env) is True  # a negation does pass; specs write positive conditions
    assert truth(evaluate("x", env)) is False and evaluate("x or one > 0", env) is True
    assert evaluate("s > 1", env) is False and evaluate("s == 1", env) is False and evaluate("s != 1", env) is True
    assert math.isnan(evaluate("one / zero", env)) and math.isnan(evaluate("s + 1", env))
    assert evaluate("isnan(x)", env) is True and math.isnan(evaluate("nanmin(x, one)", env))
    with pytest.raises(RuleError, match="unknown quantity 'nope'"):
        evaluate("nope > 1", env)
    assert math.isnan(Env({"a": 1}, nan_prefixes=("pred",))["pred.slope"])


@pytest.mark.parametrize(
    "bad",
    [
        "__import__('os')",
        "x[0]",
        "(lambda: 1)()",
        "x.__class__",
        "f'{x}'",
        "x if y",
        "abs(x, key=1)",
        "[1, 2]",
        "open('f')",
    ],
)
def test_what_a_rule_may_not_say(bad: str) -> None:
    with pytest.raises(RuleError):
        Evaluator({"x": 1, "y": 1})(bad)


def test_rules_load_by_name_and_resolve_extends() -> None:
    assert {
        "e2",
        "basin-1",
        "basin-2",
        "toolslow",
        "toolslow-3way",
        "shed",
        "rescue-r1",
        "rescue-r4",
        "cut-a",
        "cut-b",
        "mirror",
        "e0b",
        "persistence",
        "trap-scores",
    } <= set(rule_names())
    e2 = load_rule("e2")  # the paired test is a spec like every other family's
    assert load_rule(None) == e2 and e2["report"] == "e2" and e2["based_on"] == ["trap_states"]
    assert [s["name"] for s in e2["states"]] == ["TRAPPED", "RECOVERED", "DRAINING", "INDETERMINATE"]
    for name in rule_names():
        spec = load_rule(name)
        assert "extends" not in spec and spec["name"] == name
    r4 = load_rule("rescue-r4")
    assert (
        r4["params"]["t_on"] == 2100.0
        and r4["roles"]["rescue"]["arm"] == "rescue-r4"
        and r4["roles"]["control"]["arm"] == "burst"
    )
    assert r4["based_on"] == ["trap_states", "endpoints", "rescue"] and "STUCK" in [
        x["name"] for x in r4["run"]["labels"]["endpoint"]
    ]
    cutb = load_rule("cut-b")
    assert (
        cutb["params"]["use_quasi_static"] == 0
        and cutb["roles"]["cut"]["arm"] == "cut-b085"
        and cutb["predictions"]["arms"] == ["cut-b085"]
    )
    # a resolved spec (what a registration freezes) loads again to itself
    assert load_rule(dict(load_rule("mirror"))) == load_rule("mirror")


def test_overrides_must_name_parameters() -> None:
    assert load_rule("shed", {"shed_fraction": 0.5})["params"]["shed_fraction"] == 0.5
    with pytest.raises(RuleError, match="shed_fractoin"):
        load_rule("shed", {"shed_fractoin": 0.5})


def _write(tmp: Path, spec: dict) -> Path:
    p = tmp / "r.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda s: s["group"].update(outcomes=[{"name": "A", "all": ["x > 1"]}]), "unconditional fallback"),
        (lambda s: s.update(measures={"m": {"metric": "nonsense"}}), "metric must be one of"),
        (lambda s: s["roles"].update(bad={"rate": 1.0}), "needs an arm"),
        (lambda s: s["seed"]["derive"].update(bad="x[1]"), "not allowed"),
        (lambda s: s.update(group_by="seed"), "group_by"),
        (lambda s: s["group"].update(aggregates={"a": {"fn": "mode", "of": "x"}}), "aggregate 'a'"),
        (lambda s: s.pop("roles"), "missing 'roles'"),
        (lambda s: s["roles"]["r"].update(expect=["GOOD"]), "roles.r.expect"),
        (lambda s: s["roles"]["r"].update(expcet=["TRAPPED"]), "roles.r.expcet: unknown key"),
        (lambda s: s["seed"].update(decided_if="r.hti > 0"), "seed.decided_if"),
    ],
)
def test_malformed_specs_are_refused(tmp_path: Path, mutate, msg: str) -> None:  # type: ignore[no-untyped-def]
    spec = {
        "name": "t",
        "params": dict(load_rule("e2")["params"]),
        "states": load_rule("e2")["states"],
        "roles": {"r": {"arm": "burst"}},
        "seed": {"derive": {"ok": "r.hit > 0.5"}},
        "group": {"outcomes": [{"name": "A", "all": ["ok >= 2"]}, {"name": "B", "all": []}]},
    }
    mutate(spec)
    with pytest.raises(RuleError, match=msg):
        load_rule(_write(tmp_path, spec))


def test_unknown_rule_and_circular_extends(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="no such rule"):
        load_rule("basin-3")
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump({"name": "a", "extends": str(a)}))
    with pytest.raises(RuleError, match="circular"):
        load_rule(a)


def test_a_project_rule_under_configs_rules_loads_by_name() -> None:
    """`analyze --rule e2-cpu` names the scaled cell's rule as its test config does."""
    from analysis.rules import CONFIG_RULE_DIR, load_rule, rule_names

    assert (CONFIG_RULE_DIR / "e2-cpu.yaml").is_file() and "e2-cpu" in rule_names()
    assert load_rule("e2-cpu")["name"] == load_rule(str(CONFIG_RULE_DIR / "e2-cpu.yaml"))["name"]
