"""No registered parameter is defaulted in code: every shipped rule spec, with any one of its
required keys removed, is refused when it is loaded, and the refusal names the field.

Required are the sections the engine reads (name, params, roles, group), every parameter (each is
read by a condition, a measure or the window statistics; one that nothing read would be dead data
in a registration), every argument of every measure, and a report's own parameters."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from analysis.expr import ordered
from analysis.rulecheck import REQUIRED_PARAMS
from analysis.rules import load_rule, rule_names

SHIPPED = rule_names()


def _refused(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(Exception) as info:
        load_rule(spec)
    assert type(info.value).__name__ == "RuleError", info.value
    assert re.search(rf"(?<![\w.]){re.escape(field)}(?![\w])", str(info.value)), (field, str(info.value))


def test_every_family_is_shipped() -> None:
    assert {"e2", "e2-cpu", "basin-1", "rescue-r1", "cut-a", "mirror", "e0b", "persistence", "trap-scores"} <= set(
        SHIPPED
    )


@pytest.mark.parametrize("name", SHIPPED)
def test_each_section_the_engine_reads_is_required(name: str) -> None:
    spec = load_rule(name)
    for key in ("name", "params", "roles", "group"):
        s = copy.deepcopy(spec)
        del s[key]
        _refused(s, f"'{key}'")


@pytest.mark.parametrize("name", SHIPPED)
def test_each_parameter_is_required(name: str) -> None:
    spec = load_rule(name)
    assert set(REQUIRED_PARAMS) <= set(spec["params"])
    for key in spec["params"]:
        s = copy.deepcopy(spec)
        del s["params"][key]
        _refused(s, f"params.{key}")


@pytest.mark.parametrize("name", SHIPPED)
def test_each_measure_argument_is_required(name: str) -> None:
    spec = load_rule(name)
    for mname, m in ordered(spec.get("measures"), "measures"):
        for arg in [k for k in m if k != "metric"]:
            s = copy.deepcopy(spec)
            del s["measures"][mname][arg]
            _refused(s, f"measures.{mname}.{arg}")


def test_a_misspelt_name_is_refused_where_it_is_read() -> None:
    spec = load_rule("e2")
    spec["seed"]["derive"]["good"] = "burst.good and noburst.good and caped.good"
    _refused(spec, "seed.derive.good")
    spec = load_rule("rescue-r1")
    spec["measures"]["pre_hit"]["start"] = "t_onn - valid_span"
    _refused(spec, "measures.pre_hit.start")


def test_bad_values_of_the_window_parameters_are_refused() -> None:
    for key, bad in (("backlog_bin", 0.0), ("hit_threshold", 1.5), ("outstanding_stat", "median")):
        spec = load_rule("e2")
        spec["params"][key] = bad
        _refused(spec, f"params.{key}")


def test_the_paired_form_of_earlier_registrations_is_refused_with_why() -> None:
    """A rule frozen before E2 became a staged spec (arms' states, a pass block) is not judged here."""
    old = {
        "name": "e2",
        "version": 1,
        "params": dict(load_rule("e2")["params"]),
        "states": load_rule("e2")["states"],
        "arms": {"BURST": ["TRAPPED"], "NOBURST": ["RECOVERED"], "CAPPED": ["RECOVERED"]},
        "pass": {"min_seeds": 3, "min_good_seeds": 2},
    }
    with pytest.raises(Exception, match="paired form"):
        load_rule(old)
