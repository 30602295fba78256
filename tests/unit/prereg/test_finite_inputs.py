"""inf and NaN are refused in every input kind, with the file, the field and the value named: configs
(cells, tests, workloads), cost files, rule specs, registration templates, calibration summaries,
registrations and both prediction formats; and `prereg fill` refuses a summary that would otherwise
fill a FILLED registration from an infinite mu or token rate."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import orjson
import pytest
from support.paths import REPO

from analysis.calibration_summaries import InputError, load_inputs
from analysis.expr import RuleError
from analysis.predictions import Predictions
from analysis.rules import load_rule
from harness.config import CellConfig, WorkloadConfig, load_config, load_cost_file, load_test, nonfinite_fields
from harness.errors import ConfigError
from prereg.fill import fill_registration
from prereg.predictions import PredictionError, load_predictions
from prereg.registration import RegistrationError, load_registration
from prereg.template import load_template

CPU_INPUTS = REPO / "prereg" / "inputs" / "vllm-cpu-tiny-131k"
CPU_TEMPLATE = REPO / "prereg" / "templates" / "e2-vllm-cpu-tiny-131k.yaml"


def _replace_once(path: Path, old: str, new: str) -> None:
    """Edit a copied file's text: `old` must occur, and only its first occurrence changes."""
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    return dst


def test_the_walk_finds_every_nonfinite_value_with_its_path() -> None:
    data = {"a": 1.0, "b": [0.5, math.inf, {"c": math.nan}], "d": {"e": -math.inf, "f": "inf", "g": 3}}
    found = nonfinite_fields(data)
    assert [loc for loc, _ in found] == ["b[1]", "b[2].c", "d.e"]
    assert found[0][1] == math.inf and math.isnan(found[1][1]) and found[2][1] == -math.inf
    assert nonfinite_fields({"a": [1, 2.0, "nan", None, True]}) == []  # strings, ints, null and booleans are not floats


# -- configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "old,new,field",
    [
        ("lambda_ref: 0.5670205674503029", "lambda_ref: .inf", "lambda_ref"),
        ("engine_cpu_quota: 0.5", "engine_cpu_quota: .nan", "engine_cpu_quota"),
        ("all_miss_token_rate: 2335.3333333333335", "all_miss_token_rate: 1e400", "all_miss_token_rate"),  # overflows
    ],
)
def test_a_cell_refuses_inf_and_nan(tmp_path: Path, old: str, new: str, field: str) -> None:
    p = _copy(REPO / "configs" / "cells" / "vllm-cpu-tiny-131k.yaml", tmp_path / "cell.yaml")
    _replace_once(p, old, new)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(p))}: {field}: got (inf|nan); expected a finite number"):
        load_config(p, CellConfig)


def test_a_cell_built_in_memory_refuses_inf() -> None:
    base = load_config(REPO / "configs" / "cells" / "vllm-cpu-tiny-131k.yaml", CellConfig).model_dump()
    with pytest.raises(ValueError, match="finite number"):
        CellConfig.model_validate({**base, "all_miss_token_rate": math.inf})


def test_a_test_config_refuses_an_infinite_rate(tmp_path: Path) -> None:
    p = _copy(REPO / "configs" / "tests" / "e2-vllm-cpu.yaml", tmp_path / "tests" / "e2-vllm-cpu.yaml")
    _replace_once(p, "rates: [1.35, 1.7]", "rates: [1.35, .inf]")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(p))}: rates\[1\]: got inf; expected a finite number"):
        load_test(p)


def test_a_workload_refuses_nan(tmp_path: Path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text("kind: workload\nname: w\ntool_time:\n  mean: .nan\n")
    with pytest.raises(ConfigError, match=r"w\.yaml: tool_time\.mean: got nan; expected a finite number"):
        load_config(p, WorkloadConfig)


def test_a_cost_file_refuses_inf(tmp_path: Path) -> None:
    p = _copy(REPO / "configs" / "costs" / "vllm-a100.yaml", tmp_path / "cost.yaml")
    _replace_once(p, "\na: 9.24e-3\n", "\na: .inf\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(p))}: a: got inf; expected a finite number"):
        load_cost_file(p)


def test_a_rule_spec_and_its_overrides_refuse_inf(tmp_path: Path) -> None:
    p = _copy(REPO / "configs" / "rules" / "e2-cpu.yaml", tmp_path / "rule.yaml")
    assert load_rule(p, {"min_window": 13.0})["params"]["min_window"] == 13.0
    with pytest.raises(RuleError, match=r"overrides: min_window: got inf; expected a finite number"):
        load_rule(p, {"min_window": math.inf})
    _replace_once(p, "  min_window: 12.0\n", "  min_window: .nan\n")
    with pytest.raises(RuleError, match=rf"rule spec {re.escape(str(p))}: params\.min_window: got nan"):
        load_rule(p)


def test_a_template_refuses_nan(tmp_path: Path) -> None:
    p = _copy(CPU_TEMPLATE, tmp_path / "t.yaml")
    _replace_once(p, "  cap_fraction: 0.95\n", "  cap_fraction: .nan\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(p))}: fill\.cap_fraction: got nan; expected a finite"):
        load_template(p)


# -- calibration summaries and the fill -----------------------------------------------------------
@pytest.mark.parametrize(
    "name,old,new,field",
    [
        ("stage-c.yaml", "mu_sessions: 0.8333333333333334", "mu_sessions: .inf", r"points\[0\]\.mu_sessions"),
        ("e0a.yaml", "all_miss_token_rate: ", "all_miss_token_rate: .inf #", "all_miss_token_rate"),
        ("e0b.yaml", "- 1.25\n", "- .inf\n", r"grid\[0\]"),
        ("e0b.yaml", "multiple: 1.25", "multiple: .inf", r"points\[0\]\.multiple"),
        ("e0b.yaml", "final_backlog: ", "final_backlog: .nan #", r"points\[0\]\.final_backlog"),
    ],
)
def test_fill_refuses_a_nonfinite_summary_naming_the_field(
    tmp_path: Path, name: str, old: str, new: str, field: str
) -> None:
    inputs = tmp_path / "in"
    shutil.copytree(CPU_INPUTS, inputs)
    fill_registration(inputs, CPU_TEMPLATE, repo_root=REPO)  # the unedited inputs fill
    _replace_once(inputs / name, old, new)
    pattern = rf"{re.escape(str(inputs / name))}: {field}: got (inf|nan); expected a finite number"
    with pytest.raises(InputError, match=pattern):
        load_inputs(inputs)
    with pytest.raises(InputError, match=pattern):
        fill_registration(inputs, CPU_TEMPLATE, repo_root=REPO)


def test_prereg_fill_command_refuses_an_infinite_mu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    inputs = tmp_path / "in"
    shutil.copytree(CPU_INPUTS, inputs)
    _replace_once(inputs / "stage-c.yaml", "mu_sessions: 0.8333333333333334", "mu_sessions: .inf")
    out = tmp_path / "reg.yaml"
    rc = main(["prereg", "fill", "--inputs", str(inputs), "--test", str(CPU_TEMPLATE), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "points[0].mu_sessions: got inf; expected a finite number" in err and "Traceback" not in err


# -- registrations ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "old,new,field",
    [
        (
            "  all_miss_token_rate: 2335.3333333333335\n  all_miss_token_rate_se",
            "  all_miss_token_rate: .inf\n  all_miss_token_rate_se",
            r"references\.all_miss_token_rate",
        ),
        ("\ntop_rate: 40.0\n", "\ntop_rate: .nan\n", "top_rate"),
        ("    budget_s: 115.2\n", "    budget_s: .inf\n", r"fill\.drain\.budget_s"),  # a free-form trace too
    ],
)
def test_a_registration_refuses_inf_and_nan(tmp_path: Path, old: str, new: str, field: str) -> None:
    p = _copy(REPO / "prereg" / "registrations" / "e2-vllm-cpu-tiny-131k.yaml", tmp_path / "r.yaml")
    load_registration(p)
    _replace_once(p, old, new)
    with pytest.raises(RegistrationError, match=rf"{re.escape(str(p))}: {field}: got (inf|nan); expected a finite"):
        load_registration(p)


# -- prediction files -----------------------------------------------------------------------------
@pytest.mark.parametrize("literal,shown", [(".inf", "inf"), (".NaN", "nan"), ("-.inf", "-inf")])
def test_a_prediction_set_refuses_inf_and_nan(tmp_path: Path, literal: str, shown: str) -> None:
    p = _copy(REPO / "predictions" / "e2-vllm-cpu-tiny-131k-simulator.yaml", tmp_path / "preds.yaml")
    load_predictions(p)
    _replace_once(p, "    rate: 1.35\n", f"    rate: {literal}\n")
    with pytest.raises(PredictionError, match=rf"{re.escape(str(p))}: predictions\[\d+\]\.about\.rate: got {shown}"):
        load_predictions(p)


def test_a_json_prediction_file_refuses_nan_and_infinity(tmp_path: Path) -> None:
    doc = {
        "format": "agentload-predictions",
        "format_version": 1,
        "rates": [{"rate": 1.65, "values": {"z": 1.02}}],
        "runs": [{"arm": "cut-a115", "rate": 1.65, "seed": 0, "values": {"slope": 0.004}}],
    }
    raw = orjson.dumps(doc).decode()
    for literal in ("NaN", "Infinity", "-Infinity", "1e400"):
        p = tmp_path / f"{literal}.json"
        p.write_text(raw.replace("0.004", literal))
        with pytest.raises(RuleError, match=rf"prediction file {re.escape(str(p))}: not valid JSON"):
            Predictions.load(p)
    doc["runs"][0]["values"]["slope"] = math.nan  # a mapping built in memory
    with pytest.raises(RuleError, match=r"runs\[0\]\.values\.slope: got nan; expected a finite number"):
        Predictions.from_dict(doc, "mem.json")
