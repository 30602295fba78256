"""How sure each simulator prediction is: flip margins by bisection (prereg/margin.py), the
knife-edge label against E0a's seed spread (prereg/margin_record.py), the prediction file's
compatible fields, and the scores of robust and knife-edge predictions apart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO
from support.provfixture import write_test

from analysis.rules import load_rule
from harness.config import load_test
from prereg.margin import DEFAULT_TOLERANCE, FlipMargin, SimRun, cell_margins, flip_margin, modal
from prereg.margin_record import combined_record, e0a_noise, load_e0a_noise, margin_record, noise_label, rel_sd
from prereg.predict_sim import simulator_predictions
from prereg.predictions import About, Prediction, dump_predictions, make_file, parse_predictions
from prereg.scoring import Outcomes, score_file
from runs.arms import references

OLD = REPO / "predictions" / "e2-vllm-cpu-tiny-131k-simulator.yaml"
OLD_FREEZE = REPO / "prereg" / "freezes" / "pred-e2-vllm-cpu-tiny-131k-simulator-20261201T120638Z.json"
OLD_COST = REPO / "configs" / "costs" / "vllm-cpu-tiny-q05-fitted.yaml"
PAPER_E0A = REPO / "prereg" / "inputs" / "paper" / "sglang-a100-300k" / "e0a.yaml"


# ------------------------------------------------------------------------------ the bisection
def test_the_noise_is_tried_first_so_a_flip_inside_it_is_known_exactly() -> None:
    def state(f: float) -> str:
        return "RECOVERED" if f > 1.031 else "TRAPPED"

    m = flip_margin(state, max_change=0.5, tol=0.02, probe=0.04)
    assert m.faster is not None and 0.031 < m.faster <= 0.04 and m.slower is None
    # the bracket: just below the margin found minus the tolerance the state is the base, at it the state differs
    assert state(1 + m.faster) != "TRAPPED" and state(1 + m.faster - 0.02) == "TRAPPED"
    m2 = flip_margin(state, max_change=0.5, tol=0.02, probe=0.03)  # the flip lies just outside this noise
    assert m2.faster is not None and m2.faster > 0.03


def test_labels_against_the_noise() -> None:
    near = {"speed": FlipMargin("TRAPPED", 0.03, None, 0.5, 5), "lambda_ref": FlipMargin("TRAPPED", None, 0.2, 0.5, 5)}
    far = {"speed": FlipMargin("GOOD", None, 0.3, 0.5, 5), "lambda_ref": FlipMargin("GOOD", 0.25, None, 0.5, 5)}
    noise = {"speed": 0.05, "lambda_ref": 0.09}
    r = margin_record(near, noise, "x", 0.5)
    assert r["label"] == "knife-edge" and r["inside_noise"] == ["speed faster"] and r["margin"] == 0.03
    assert r["speed"] == {"faster": 0.03, "slower": None, "noise": 0.05}
    assert r["lambda_ref"] == {"higher": None, "lower": 0.2, "noise": 0.09}
    assert margin_record(far, noise, "x", 0.5)["label"] == "robust"
    assert margin_record(far, {"speed": 0.05, "lambda_ref": None}, "x", 0.5)["label"] == "unjudged"
    assert margin_record(near, None, "x", 0.5)["label"] == "unjudged"
    both = combined_record([margin_record(near, noise, "a", 0.5), margin_record(far, noise, "b", 0.5)], noise, "c", 0.5)
    assert both["speed"]["faster"] == 0.03 and both["speed"]["slower"] == 0.3 and both["label"] == "knife-edge"
    assert modal(["A", "B", "A"]) == "A" and modal(["A", "B"]) == "TIE:A/B"


def test_the_noise_is_e0a_s_relative_seed_sd() -> None:
    n = load_e0a_noise(PAPER_E0A, "prereg/inputs/paper/sglang-a100-300k/e0a.yaml")
    # the paper's E0a: uncached tokens/s 11076, 11342, 11312; mu_turns 0.0643, 0.0773, 0.0730
    assert (
        n["speed"] == pytest.approx(rel_sd([11076.0, 11342.0, 11312.0]), abs=1e-6) == pytest.approx(0.01296, abs=1e-4)
    )
    assert n["lambda_ref"] == pytest.approx(0.0924, abs=1e-3)
    assert n["e0a"]["sha256"] == hashlib.sha256(PAPER_E0A.read_bytes()).hexdigest()
    assert rel_sd([1.0]) is None


# ------------------------------------------------------------------------------ on the simulator
def _e0a(path: Path, spread: float) -> Path:
    """An E0a summary whose three seeds scatter by `spread` (relative sd) in both columns."""
    rows = [
        {
            "seed": s,
            "n": 32,
            "mu_sessions": 0.07,
            "mu_turns": 0.07 * (1 + d * spread),
            "uncached_token_rate": 1e4 * (1 + d * spread),
        }
        for s, d in ((0, -1.0), (1, 0.0), (2, 1.0))
    ]
    path.write_text(
        yaml.safe_dump(
            {
                "format": "agentload-calibration",
                "format_version": 1,
                "stage": "e0a",
                "cell": "sglang-a100-300k",
                "per_seed": rows,
            }
        )
    )
    return path


def _state_margin(pf: Any, arm: str) -> dict[str, Any]:
    return next(p.margin for p in pf.predictions if p.quantity == "state" and p.about.arm == arm)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("margins")
    t = write_test(root)
    e0a = _e0a(root / "e0a.yaml", 0.03)
    pf = simulator_predictions(t, n_seeds=1, e0a=e0a)
    return {"root": root, "test": t, "e0a": e0a, "pf": pf}


def test_every_simulator_prediction_carries_its_margin_and_the_file_says_how(tiny: dict[str, Any]) -> None:
    pf = tiny["pf"]
    assert all(p.margin is not None for p in pf.predictions)
    blk = pf.margins
    assert blk is not None and blk["tolerance"] == DEFAULT_TOLERANCE and blk["noise"]["speed"] == pytest.approx(0.03)
    assert blk["simulated_runs"] > 0 and blk["noise"]["e0a"]["sha256"]
    back = parse_predictions(dump_predictions(pf))  # the fields survive the file
    assert [p.margin for p in back.predictions] == [p.margin for p in pf.predictions] and back.margins == blk
    # far from the edge: NOBURST stays good whatever the speed and lambda_ref within 50%
    nb = _state_margin(pf, "noburst")
    assert nb["label"] == "robust" and not nb["bounded"] and nb["margin"] == 0.5


def _lambda_side(m: dict[str, Any]) -> tuple[str, str, float, float]:
    """BURST's lambda_ref side that flips (a heavier or a lighter load than the registered one):
    (side, the other side, its sign, the margin)."""
    lam = m["lambda_ref"]
    side = "higher" if lam["higher"] is not None else "lower"
    assert lam[side] is not None, m  # the tiny test's BURST changes state within 50% of lambda_ref
    return side, "lower" if side == "higher" else "higher", 1.0 if side == "higher" else -1.0, float(lam[side])


def test_the_margins_found_bracket_the_flip(tiny: dict[str, Any]) -> None:
    m = _state_margin(tiny["pf"], "burst")
    bundle = load_test(tiny["test"])
    rule = load_rule(bundle.rule_path)
    for knob, sides in (("lambda_ref", ("higher", "lower")), ("speed", ("faster", "slower"))):
        run = SimRun(bundle, "burst", 1.35, 1000, rule, references(bundle), knob=knob)
        assert run.state_at(1.0) == m["state"]
        for side, sign in zip(sides, (1.0, -1.0), strict=True):
            x = m[knob][side]
            if x is None:
                continue
            # the margin found flips it; a tolerance less does not
            assert run.state_at(1 + sign * x) != m["state"], (knob, side, x)
            assert run.state_at(1 + sign * max(x - DEFAULT_TOLERANCE, 0.0)) == m["state"], (knob, side, x)
    assert m["bounded"]


def test_a_prediction_placed_on_the_edge_by_construction_is_knife_edge(tiny: dict[str, Any]) -> None:
    """The test again, its lambda_ref moved to where BURST's state has just flipped: the change back
    is at most about the bisection's tolerance, inside a noise of 3%."""
    m = _state_margin(tiny["pf"], "burst")
    _side, back, sign, x = _lambda_side(m)
    assert x <= 0.3  # so that a tolerance of 0.02 back from the flip lies within 3% of the moved lambda_ref
    bundle = load_test(tiny["test"])
    lam = references(bundle)["lambda_ref"] * (1 + sign * x)
    t = tiny["test"].with_name("tiny-edge.yaml")
    t.write_text(
        tiny["test"].read_text().replace("name: tiny-e2", "name: tiny-edge")
        + f"references: {{lambda_ref: {lam!r}, all_miss_token_rate: {references(bundle)['all_miss_token_rate']!r}, "
        "source: moved onto the flip}\n"
    )
    pf = simulator_predictions(t, n_seeds=1, arms=["burst"], e0a=tiny["e0a"])
    edge = _state_margin(pf, "burst")
    assert edge["state"] != m["state"], (edge, m)
    assert edge["lambda_ref"][back] is not None and edge["lambda_ref"][back] <= 0.03, edge
    assert edge["label"] == "knife-edge" and f"lambda_ref {back}" in edge["inside_noise"]


def test_the_design_step_and_the_prediction_share_the_margins(tiny: dict[str, Any]) -> None:
    """One implementation: cell_margins on the prediction's own bundle and seed gives the values the
    prediction file carries (prereg/design.py calls the same function)."""
    bundle = load_test(tiny["test"])
    noise = e0a_noise(load_e0a_summary(tiny["e0a"]))
    cm = cell_margins(bundle, "burst", 1.35, [1000], load_rule(bundle.rule_path), references(bundle), noise=noise)
    rec = margin_record(cm.margins, noise, "the modal state of fresh seeds [1000]", 0.5)
    want = _state_margin(tiny["pf"], "burst")
    for k in ("state", "speed", "lambda_ref", "margin", "label"):
        assert rec[k] == want[k], k


def load_e0a_summary(path: Path) -> Any:
    from analysis.calibration_summaries import load_summary

    return load_summary(path, "e0a")


# ------------------------------------------------------------------------------ the file and the scores
def test_an_old_prediction_file_loads_verifies_and_scores_without_margins() -> None:
    raw = OLD.read_bytes()
    rec = json.loads(OLD_FREEZE.read_text())
    assert hashlib.sha256(raw).hexdigest() == rec["files"][0]["sha256"]  # the frozen bytes, unchanged
    pf = parse_predictions(raw)
    assert pf.margins is None and all(p.margin is None and p.margin_label is None for p in pf.predictions)
    again = dump_predictions(pf)
    assert b"margin" not in again and dump_predictions(parse_predictions(again)) == again
    sc = score_file(pf, Outcomes())
    assert sc.by_margin == {} and all(s.margin_label is None for s in sc.scored)


def _pred(pid: str, seed: int, label: str, p: float) -> Prediction:
    m = {
        "of": "x",
        "state": "TRAPPED",
        "speed": {"faster": 0.03, "slower": None, "noise": 0.05},
        "margin": 0.03,
        "bounded": True,
        "inside_noise": [],
        "label": label,
    }
    return Prediction(
        pid,
        "stuck",
        About("run", "burst", 1.65, seed),
        "probability",
        {"kind": "simulator"},
        {"event": {"equals": True}, "probability": p},
        margin=m,
    )


def test_scores_are_reported_for_robust_and_knife_edge_predictions_apart() -> None:
    preds = [_pred("a", 0, "robust", 0.9), _pred("b", 1, "robust", 0.8), _pred("c", 2, "knife-edge", 0.9)]
    pf = make_file("t", preds, test="x", registration=None, predictor={"kind": "simulator"}, could_see=["nothing"])
    pf = parse_predictions(dump_predictions(pf))
    oc = Outcomes()
    for s, v in ((0, True), (1, True), (2, False)):
        oc.put("stuck", About("run", "burst", 1.65, s).key(), v)
    sc = score_file(pf, oc)
    assert list(sc.by_margin) == ["robust", "knife-edge"]
    assert (sc.by_margin["robust"]["n"], sc.by_margin["robust"]["hit"]) == (2, 2)
    assert (sc.by_margin["knife-edge"]["n"], sc.by_margin["knife-edge"]["miss"]) == (1, 1)
    assert sc.summary["default"]["n"] == 3  # the layer summaries are kept
    s = next(x for x in sc.scored if x.id == "c")
    assert s.margin_label == "knife-edge" and s.margin == 0.03 and "speed: faster 3%" in str(s.margin_detail)


def test_a_malformed_margin_is_refused_with_its_field() -> None:
    pf = make_file("t", [_pred("a", 0, "robust", 0.9)], test="x", registration=None, predictor={}, could_see=["n"])
    doc = pf.to_dict()
    doc["predictions"][0]["margin"]["label"] = "sure"
    with pytest.raises(Exception, match=r"predictions\[a\]\.margin"):
        parse_predictions(yaml.safe_dump(doc))


def test_the_html_page_shows_margins_and_the_split_scores() -> None:
    from review.html.records import score_report

    preds = [_pred("a", 0, "robust", 0.9), _pred("c", 2, "knife-edge", 0.9)]
    pf = make_file("t", preds, test="x", registration=None, predictor={"kind": "simulator"}, could_see=["nothing"])
    oc = Outcomes()
    oc.put("stuck", About("run", "burst", 1.65, 0).key(), True)
    sc = score_file(pf, oc)
    rep = {
        "tag": "T",
        "commit": "c" * 40,
        "files": [],
        "problems": [],
        "scores": [
            {
                "file": "f.yaml",
                "name": sc.name,
                "summary": sc.summary,
                "by_margin": sc.by_margin,
                "scored": [s.to_json() for s in sc.scored],
            }
        ],
    }
    html = score_report(rep, Path("T.score.json"))
    assert "<table class='margins'>" in html and "<th>flip margin</th>" in html
    assert 'class="badge knife-edge"' in html and 'class="badge robust"' in html
    assert "Robust and knife-edge predictions apart" in html


def test_the_design_step_finds_and_labels_the_margins_a_prediction_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prereg design --flip-margins` and `predict make sim` give one arm x rate the same record:
    same bisection, defaults, noise (the design's own E0a input) and label. The simulator is
    replaced by a rule: BURST recovers once the engine is more than 4% faster or lambda_ref 20% lower."""
    import prereg.design as D
    import prereg.design_search as S
    from analysis.calibration_summaries import load_inputs
    from prereg.predict_margins import plan_margins

    calls: list[tuple[str, str, float]] = []

    def fake_run(self: SimRun, factor: float = 1.0) -> tuple[str, dict[str, Any]]:
        calls.append((self.arm.upper(), self.knob, round(factor, 6)))
        if self.arm.upper() == "BURST":
            flipped = (self.knob == "speed" and factor > 1.04) or (self.knob == "lambda_ref" and factor < 0.8)
            return ("RECOVERED" if flipped else "TRAPPED"), {}
        return "RECOVERED", {}

    monkeypatch.setattr(SimRun, "run", fake_run)
    monkeypatch.setattr(D, "_STATES", {})
    inputs = REPO / "prereg" / "inputs" / "vllm-cpu-tiny-131k"
    ctx = D.load_context(inputs, REPO / "prereg" / "templates" / "e2-vllm-cpu-tiny-131k.yaml", OLD_COST)
    fe = D.formula_eval(ctx, ctx.baseline())
    seeds = [1000, 1001, 1002]
    mg = S.margins(ctx, fe, seeds)
    assert len(mg) == len(ctx.arms) * len(fe.multiples)
    burst = [m for m in mg if m["arm"] == "BURST"]
    assert burst and all(m["label"] == "knife-edge" and m["inside_noise"] == ["speed faster"] for m in burst)
    assert all(0.04 < m["speed"]["faster"] <= 0.04 + DEFAULT_TOLERANCE for m in burst)
    assert all(0.2 < m["lambda_ref"]["lower"] <= 0.2 + DEFAULT_TOLERANCE for m in burst)
    assert all(m["label"] == "robust" and not m["bounded"] for m in mg if m["arm"] != "BURST")
    noise = e0a_noise(load_inputs(inputs).e0a)
    assert burst[0]["speed"]["noise"] == noise["speed"] == pytest.approx(0.0577, abs=1e-4)
    # the prediction's path on the same runs: the same records
    verdicts = {
        (a, r, s): {"state": "TRAPPED" if a.upper() == "BURST" else "RECOVERED", "stats": {}}
        for a in ctx.arms
        for r in fe.multiples
        for s in seeds
    }
    pm = plan_margins(
        D.sim_bundle(ctx, fe, seeds),
        fe.rule or ctx.rule,
        list(ctx.arms),
        fe.multiples,
        seeds,
        [],
        verdicts,
        noise=noise,
    )
    for m in mg:
        key = next(k for k in pm.fresh if k[0].upper() == m["arm"] and k[1] == m["rate"])
        assert {k: v for k, v in m.items() if k not in ("arm", "rate", "simulated_runs")} == pm.fresh[key]


def test_noise_label_requires_the_knobs_it_is_told() -> None:
    """One labelling rule for a prediction (both knobs required) and a replay (speed only): the
    same robust speed margins are "robust" when speed is all that is required, "unjudged" when
    lambda_ref is required too; a side at or under its noise is knife-edge either way; an unknown
    noise leaves it unjudged."""
    speed_only = {"speed": {"faster": 0.2, "slower": None}}
    assert noise_label(speed_only, {"speed": 0.07}, ("speed",)) == ([], "robust")
    assert noise_label(speed_only, {"speed": 0.07}) == ([], "unjudged")
    assert noise_label(speed_only, {"speed": None}, ("speed",)) == ([], "unjudged")
    edge = {"speed": {"faster": 0.07, "slower": 0.3}, "lambda_ref": {"higher": 0.5, "lower": None}}
    assert noise_label(edge, {"speed": 0.07, "lambda_ref": 0.04}) == ([("speed", "faster")], "knife-edge")
    assert noise_label(edge, {"speed": 0.069, "lambda_ref": 0.04}) == ([], "robust")
