"""Frozen prediction files: read as input, matched to runs by arm, rate, seed and plan, and frozen
from the plans a test's runs will play (model F's plan-driven fluid and asymptotics)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import orjson
import pytest

from analysis.expr import RuleError
from analysis.predictions import Predictions
from analysis.rules import load_rule
from analysis.theory.fluid import plan_fluid_from_plan
from analysis.theory.model_f import model_f_from_cost
from analysis.theory.moments import workload_moments
from analysis.theory.predict import freeze_predictions
from harness.config import load_test
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan


def _doc() -> dict:
    return {
        "format": "agentload-predictions",
        "format_version": 1,
        "rates": [{"rate": 1.65, "values": {"z": 1.02}}],
        "runs": [{"arm": "cut-a115", "rate": 1.65, "seed": 0, "plan_sha256": "ab" * 32, "values": {"slope": 0.004}}],
    }


def test_values_are_matched_and_a_foreign_plan_is_withheld(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_bytes(orjson.dumps(_doc()))
    pr = Predictions.load(p)
    assert pr.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    q, note = pr.for_run("CUT-A115", 1.65, 0, "ab" * 32)
    assert q == {"pred.z": 1.02, "pred.slope": 0.004} and note == ""
    q, note = pr.for_run("cut-a115", 1.65, 0, "cd" * 32)
    assert q == {"pred.z": 1.02} and "withheld" in note  # frozen for another plan: not this run's prediction
    assert pr.for_run("burst", 1.65, 0, None) == ({"pred.z": 1.02}, "")
    assert pr.for_run("cut-a115", 1.35, 0, None) == ({}, "")


def test_malformed_prediction_files(tmp_path: Path) -> None:
    bad = tmp_path / "b.json"
    bad.write_text("{")
    with pytest.raises(RuleError, match="not valid JSON"):
        Predictions.load(bad)
    with pytest.raises(RuleError, match="format"):
        Predictions.from_dict({"format": "x"})
    with pytest.raises(RuleError, match="missing 'seed'"):
        Predictions.from_dict({"format": "agentload-predictions", "runs": [{"arm": "a", "rate": 1, "values": {}}]})


def test_freeze_computes_from_the_runs_own_plans(tmp_path: Path) -> None:
    (tmp_path / "protocols").mkdir()
    (tmp_path / "protocols" / "short.yaml").write_text(
        "kind: protocol\nname: short\nduration: 4000.0\nburst: {time: 1200.0, size: 200, width: 60.0}\n"
        "window: {start: 3000.0, end: 4000.0}\nmin_window: 600.0\n"
    )
    t = tmp_path / "t.yaml"
    t.write_text(
        "kind: test\nname: t\nrule: cut-a\ncell: sglang-a100-300k\nworkload: standard\nprotocol: protocols/short.yaml\n"
        "arms: [cut-a115, burst]\nrates: [1.65]\nseeds: [3]\n"
    )
    b = load_test(t)
    spec = load_rule("cut-a")
    out = freeze_predictions(b, spec)
    assert [(e["arm"], e["seed"]) for e in out["runs"]] == [("cut-a115", 3)]  # only the arm the rule predicts
    plan = make_plan(b.workload, b.protocol, b.arms["cut-a115"], 1.65, 0.071534, 3)
    e = out["runs"][0]
    assert e["plan_sha256"] == hashlib.sha256(plan_bytes(plan)).hexdigest()
    mf, _ = model_f_from_cost(b.cell.cost.model(), workload_moments(b.workload), b.cell.kv_pool_tokens, b.cell.batching)
    res = plan_fluid_from_plan(mf, plan, t_end=4000.0)
    assert e["values"]["slope"] == pytest.approx(res.backlog_slope(3000.0, 4000.0))
    assert e["values"]["end_backlog"] == pytest.approx(
        float(sum((res.sessions["arrival"] <= 3999.999) & (res.sessions["end"] > 3999.999)))
    )
    # [5700, 8700) does not exist in a 4000 s protocol: no prediction rather than a made-up one
    assert e["values"]["completions_late"] is None and e["values"]["slope_late"] is None
    assert len(e["trajectory"]["t"]) == len(e["trajectory"]["backlog"]) and math.isfinite(
        e["trajectory"]["backlog"][-1]
    )
