"""The prediction file format (strict loading, byte-stable writing), the scorer's arithmetic, and the
blindness and record readers on hand-made times."""

from __future__ import annotations

import itertools
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.gitfixture import make_repo
from support.provfixture import write_test

from cli.main import main
from prereg.predictions import (
    About,
    Prediction,
    PredictionError,
    dump_predictions,
    load_predictions,
    make_file,
    parse_predictions,
)
from prereg.scoring import Outcomes, at_least_probability, clause_outcome, clause_probability, score_file
from review.records import RecordError, RunRecord, parse_utc, read_accounting, read_manifest
from review.timeline import BLIND, BLIND_START, NOT_BLIND, RunTimes, blindness


def _p(pid: str, seed: int, p: float, quantity: str = "stuck") -> Prediction:
    return Prediction(
        pid,
        quantity,
        About("run", "burst", 1.65, seed),
        "probability",
        {"kind": "declared"},
        {"event": {"equals": True}, "probability": p},
    )


def _file(preds: list[Prediction]) -> bytes:
    return dump_predictions(
        make_file("t", preds, test="x", registration=None, predictor={"kind": "declared"}, could_see=["nothing"])
    )


def test_round_trip_is_byte_stable() -> None:
    data = _file([_p("a", 0, 0.3), _p("b", 1, 0.7)])
    pf = parse_predictions(data)
    assert dump_predictions(pf) == data and [p.id for p in pf.predictions] == ["a", "b"]


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(extra=1), "top-level keys"),
        (lambda d: d.update(could_see=[]), "could_see"),
        (lambda d: d["predictions"][0].update(probability=1.5), r"predictions\[a\]\.probability: got 1.5"),
        (lambda d: d["predictions"][0].update(kind="guess"), "kind"),
        (lambda d: d["predictions"][0]["about"].pop("seed"), r"about\.seed: got None; expected present for scope run"),
        (lambda d: d["predictions"][1].update(id="a"), "unique ids"),
        (lambda d: d.update(declared_blindness={"label": "blind in time", "statement": "x"}), "declared_blindness"),
        (
            lambda d: d["predictions"].append(
                {
                    "id": "v",
                    "quantity": "hit",
                    "kind": "value",
                    "about": {"scope": "test"},
                    "value": 1.0,
                    "tolerance": {"abs": 0.1, "rel": 0.1},
                    "source": {"kind": "declared"},
                }
            ),
            "exactly one of",
        ),
        (
            lambda d: d["predictions"].append(
                {
                    "id": "r",
                    "quantity": "rule",
                    "kind": "rule_probability",
                    "about": {"scope": "test"},
                    "rule": {"all": [{"prediction": "a", "is": True}, {"prediction": "a", "is": False}]},
                    "source": {"kind": "declared"},
                }
            ),
            "each per-run prediction used once",
        ),
        (
            lambda d: d["predictions"].append(
                {
                    "id": "r",
                    "quantity": "rule",
                    "kind": "rule_probability",
                    "about": {"scope": "test"},
                    "rule": {"at_least": 2, "of": [{"prediction": "zz", "is": True}]},
                    "source": {"kind": "declared"},
                }
            ),
            "between 0 and 1",
        ),
    ],
)
def test_malformed_files_name_the_field(edit, match: str) -> None:
    import yaml

    doc = yaml.safe_load(_file([_p("a", 0, 0.3), _p("b", 1, 0.7)]))
    edit(doc)
    with pytest.raises(PredictionError, match=match):
        parse_predictions(yaml.safe_dump(doc), "f.yaml")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=6), st.integers(0, 6))
def test_at_least_matches_enumeration(ps: list[float], k: int) -> None:
    k = min(k, len(ps))
    brute = sum(
        math.prod(p if x else 1 - p for p, x in zip(ps, xs))
        for xs in itertools.product([0, 1], repeat=len(ps))
        if sum(xs) >= k
    )
    assert at_least_probability(ps, k) == pytest.approx(brute, abs=1e-12)


def test_clause_probability_and_outcome() -> None:
    rule = {
        "all": [
            {"at_least": 2, "of": [{"prediction": f"g{i}", "is": True} for i in range(3)]},
            {"prediction": "s", "is": False},
        ]
    }
    p = {"g0": 0.71, "g1": 0.71, "g2": 0.71, "s": 0.1}
    assert clause_probability(rule, p) == pytest.approx((3 * 0.71**2 * 0.29 + 0.71**3) * 0.9)
    assert clause_outcome(rule, {"g0": True, "g1": True, "g2": None, "s": False}) is True  # decided without g2
    assert clause_outcome(rule, {"g0": True, "g1": None, "g2": None, "s": False}) is None
    assert clause_outcome(rule, {"g0": False, "g1": False, "g2": None, "s": False}) is False


def test_scoring_declarations() -> None:
    preds = [
        _p("half", 0, 0.5),
        Prediction(
            "cat",
            "state",
            About("run", "burst", 1.65, 1),
            "categorical",
            {"kind": "declared"},
            {"probabilities": {"TRAPPED": 0.6, "DRAINING": 0.4}},
        ),
        Prediction(
            "w",
            "wave",
            About("run", "burst", 1.65, 2),
            "value",
            {"kind": "declared"},
            {
                "value": 5000.0,
                "transform": {"origin": 1200.0, "factor": 0.5},
                "tolerance": {"rel_of_offset": 0.1, "origin": 1200.0},
            },
        ),
        Prediction(
            "c",
            "slope",
            About("run", "burst", 1.65, 2),
            "closest",
            {"kind": "declared"},
            {"value": 0.01, "comparators": {"naive": 0.03}},
        ),
        Prediction(
            "missing",
            "hit",
            About("run", "burst", 1.65, 3),
            "value",
            {"kind": "declared"},
            {"value": 0.9, "tolerance": {"abs": 0.1}},
        ),
    ]
    pf = parse_predictions(_file(preds))
    oc = Outcomes()
    oc.put("stuck", About("run", "BURST", 1.65, 0).key(), True)
    oc.put("state", About("run", "burst", 1.65, 1).key(), "draining")
    oc.put("wave", About("run", "burst", 1.65, 2).key(), 3350.0)  # read as 3100 +- 190
    oc.put("slope", About("run", "burst", 1.65, 2).key(), 0.02)  # equidistant: not strictly closest
    s = {x.id: x for x in score_file(pf, oc).scored}
    assert s["half"].result == "no call" and s["half"].brier == pytest.approx(0.25)
    assert (
        s["cat"].result == "miss"
        and s["cat"].brier == pytest.approx(0.6**2 + 0.6**2)
        and s["cat"].log_score == pytest.approx(math.log(0.4))
    )
    assert s["w"].result == "miss" and s["w"].error == pytest.approx(250.0)
    assert s["c"].result == "miss"
    assert s["missing"].result == "no outcome"


def _rt(submit: datetime, start: datetime) -> RunTimes:
    r = RunRecord(Path("r"), {}, "burst", 1.65, 0, "COMPLETED", start, start + timedelta(hours=2), None, None, None)
    return RunTimes(r, None, submit, start, start + timedelta(hours=2), "scheduler")


def test_blindness_labels_from_times() -> None:
    t0 = datetime(2026, 10, 31, 9, 20, 20, tzinfo=UTC)
    runs = [_rt(t0, t0 + timedelta(hours=1)), _rt(t0 + timedelta(seconds=5), t0 + timedelta(hours=3))]
    assert blindness(t0 - timedelta(seconds=80), runs).label == BLIND
    assert blindness(t0 + timedelta(minutes=10), runs).label == BLIND_START  # submitted before, started after
    assert blindness(t0, runs).label == BLIND_START  # equal to the submit second is not before it: conservative
    assert blindness(t0 + timedelta(hours=1), runs).label == NOT_BLIND
    b = blindness(t0 + timedelta(hours=2), runs, declared="blind by access only")
    assert b.label == NOT_BLIND and b.text() == "not blind; declared blind by access only (not verified)"
    assert blindness(None, runs).reason == "no record that the freeze reached the remote"


def test_record_readers(tmp_path: Path) -> None:
    assert parse_utc("2026-10-24T15:13:39") == datetime(2026, 10, 24, 15, 13, 39, tzinfo=UTC)  # naive = UTC
    assert parse_utc("2026-10-24T10:13:39-05:00") == datetime(2026, 10, 24, 15, 13, 39, tzinfo=UTC)
    assert parse_utc("Unknown") is None
    (tmp_path / "provenance").mkdir()
    rows = [
        {"JobID": "17", "Submit": "2026-10-24T15:13:39", "Start": "Unknown", "End": "Unknown", "State": "PENDING"},
        {"JobID": "17.batch", "Submit": "2026-10-24T15:13:39"},
    ]
    (tmp_path / "provenance" / "accounting.json").write_text(json.dumps(rows))
    acc = read_accounting(tmp_path)
    assert acc is not None and list(acc) == ["17"] and acc["17"].start is None
    (tmp_path / "submission.json").write_text(json.dumps({"registration": {"path": "r.yaml"}}))
    with pytest.raises(RecordError, match=r"registration\.sha256: missing"):
        read_manifest(tmp_path)
    export = {
        "rows": [
            {
                "job_id": "18",
                "submit_utc": "2026-10-24T15:13:39+00:00",
                "start_utc": None,
                "end_utc": None,
                "state": "PENDING",
            }
        ]
    }
    (tmp_path / "provenance" / "accounting.json").write_text(json.dumps(export))  # the export's own column names
    acc = read_accounting(tmp_path)
    assert acc is not None and acc["18"].submit == datetime(2026, 10, 24, 15, 13, 39, tzinfo=UTC)
    rows[0]["Submit"] = "yesterday"
    (tmp_path / "provenance" / "accounting.json").write_text(json.dumps(rows))
    with pytest.raises(RecordError, match=r"rows\[0\]\.Submit: got 'yesterday'"):
        read_accounting(tmp_path)


def test_make_commands_write_loadable_sets(tmp_path: Path) -> None:
    """`predict make entry` and `predict make model-f` from the command line (no simulation needed)."""
    assert main(["predict", "make", "entry", "--cell", "sglang-a100-300k", "--out", str(tmp_path / "entry.yaml")]) == 0
    pf = load_predictions(tmp_path / "entry.yaml")
    by = {p.quantity: p for p in pf.predictions if p.about.target == "stage-c:sglang-a100-300k"}
    assert by["onset_n_b"].payload["value"] == pytest.approx(
        32.70, abs=0.01
    )  # App. E.9: n_b = 4.94 + 27.76 = 32.70 at 300k
    assert by["crossing_0.5"].payload["tolerance"] == {"abs": 3.0} and pf.predictor["kind"] == "entry_model"
    work, _ = make_repo(tmp_path / "repo")
    t = write_test(work)
    out = tmp_path / "mf.yaml"
    assert main(["predict", "make", "model-f", str(t), "--intervals", "600:1800", "--wave", "--out", str(out)]) == 0
    ids = {p.id for p in load_predictions(out).predictions}
    assert {"mf-burst-r1.35-s0-slope-600_1800", "mf-burst-r1.35-s1-wave", "mf-burst-r1.35-s0-stuck"} <= ids
    assert not any("noburst" in i for i in ids)  # model F predicts a trap entered at a burst
