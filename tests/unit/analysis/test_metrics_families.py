"""The quantities the registered families read, on small hand-made run tables whose answers can
be counted by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import family_metrics as M
from analysis.measures import RunTables, measure_all

# the endpoints' persistence windows (App. D, AMB-11) and the paper's hit threshold
PERSIST = {"width": 300.0, "step": 10.0, "onset_max": 0.2, "escape_min": 0.5, "threshold": 0.5}


def sessions(rows: list[tuple[int, str, float, float | None, str]]) -> pd.DataFrame:
    """(session, kind, arrival, end, outcome)."""
    return pd.DataFrame(
        [
            {
                "session": s,
                "kind": k,
                "arrival": a,
                "admission": a,
                "end": e,
                "outcome": o,
                "gate_wait": 0.0,
                "paused_time": None,
            }
            for s, k, a, e, o in rows
        ]
    )


def turns(rows: list[tuple[int, int, float, int, int]]) -> pd.DataFrame:
    """(session, turn, done_time, prompt, cached), all ok; sent 1 s before done."""
    return pd.DataFrame(
        [
            {
                "session": s,
                "kind": "base",
                "turn": k,
                "send_time": d - 1.0,
                "first_token_time": d - 0.5,
                "done_time": d,
                "prompt_tokens": p,
                "cached_tokens": c,
                "status": "ok",
            }
            for s, k, d, p, c in rows
        ]
    )


def test_completions_wave_and_arrivals() -> None:
    ss = sessions(
        [
            (0, "base", 0.0, 50.0, "completed"),
            (1, "burst", 10.0, 150.0, "completed"),
            (2, "burst", 11.0, 250.0, "completed"),
            (3, "burst", 12.0, None, "unfinished"),
            (4, "base", 120.0, 130.0, "failed"),
            (5, "base", 130.0, 130.0, "refused"),
        ]
    )
    assert M.completions(ss, 100.0, 300.0) == pytest.approx(2 / 200.0)  # the failed one is no completion
    med, done, n = M.wave_time(ss, "burst")
    assert (med, done, n) == (250.0, 2, 3)  # the unfinished one counts as after the run
    ss2 = sessions(
        [
            (1, "burst", 10.0, 150.0, "completed"),
            (2, "burst", 11.0, None, "unfinished"),
            (3, "burst", 12.0, None, "unfinished"),
        ]
    )
    assert math.isnan(M.wave_time(ss2, "burst")[0])
    assert M.plan_arrival_rate(ss, 100.0, 200.0, "base") == pytest.approx(
        2 / 100.0
    )  # refused arrivals are plan arrivals
    assert M.in_system_at(ss, 140.0) == 3  # 1, 2, 3 (0 left, 4 failed at 130, 5 refused)


def test_mean_prompt_and_gap_trend() -> None:
    # one session whose gaps grow linearly with completion time: gap = 0.5 t exactly
    done = [100.0]
    for _ in range(12):
        done.append(done[-1] * 1.5)  # gap_k = done_k - done_{k-1} = done_k / 3
    tt = turns([(0, k + 1, d, 2000 + 650 * k, 0) for k, d in enumerate(done)])
    d, g = M.turn_gaps(tt)
    assert np.allclose(g, d / 3.0)
    slope, c, _y = M.gap_trend(tt, 0.0, 20000.0, width=1e9)
    assert math.isnan(slope) and len(c) == 1  # one bin: no trend
    slope, c, _y = M.gap_trend(tt, 0.0, 20000.0, width=300.0)
    assert slope > 0
    assert M.mean_prompt(tt, 0.0, 200.0) == pytest.approx((2000 + 2650) / 2)


def test_tiles_cover_the_remainder_with_the_last_window() -> None:
    assert M.tiles(4550.0 + 300, 8700.0, 300.0)[-1] == (8400.0, 8700.0)
    t = M.tiles(0.0, 700.0, 300.0)
    assert t == [(0.0, 300.0), (300.0, 600.0), (400.0, 700.0)]
    assert M.tiles(0.0, 200.0, 300.0) == [(0.0, 200.0)]


def test_tiled_and_rolling_followup_and_persistence() -> None:
    # follow-up turns every 10 s: hits until 1300, misses from 1300 to 5000, hits again after 5000
    rows = []
    for i, t in enumerate(np.arange(5.0, 8700.0, 10.0)):
        hit = t < 1300 or t >= 5000
        rows.append((i, 2, float(t), 1000, 900 if hit else 0))
    tt = turns(rows)
    tf = M.tiled_followup(tt, 5000.0, 8700.0, 300.0, 0.5)
    assert tf["min"] == 1.0 and tf["empty"] == 0 and tf["n"] == 13
    a, v = M.rolling_followup(tt, 0.0, 8700.0, 300.0, 10.0, 0.5)
    assert a[0] == 0.0 and a[-1] == 8400.0 and v[0] == 1.0
    p = M.persistence(tt, 1260.0, 8700.0, **PERSIST)
    assert p["onset"] == 1260.0  # the first window at or after the trigger's end at most 0.2 (4 hits of 30)
    assert 4840.0 <= p["escape"] <= 4860.0  # the first later window at least 0.5
    assert p["trapped_s"] == pytest.approx(p["escape"] - 1260.0)
    q = M.persistence(tt, 1260.0, 4000.0, **PERSIST)  # an intervention at 4000 s: the escape is not counted
    assert math.isnan(q["escape"]) and q["max_after"] <= 0.2 + 1e-9


def test_trigger_outlived_and_gate_summary() -> None:
    ss = sessions(
        [
            (0, "burst", 10.0, 500.0, "completed"),
            (1, "base", 20.0, 900.0, "completed"),
            (2, "base", 30.0, None, "unfinished"),
        ]
    )
    tt = turns([(1, 2, 600.0, 3000, 0), (1, 3, 700.0, 3650, 3000), (2, 2, 800.0, 3000, 0)])
    out = M.trigger_outlived(tt, ss, None, 1000.0, "burst", 0.5)
    assert (
        out["last_left"] == 500.0 and out["before_end"] == 500.0 and out["turns_after"] == 3 and out["hits_after"] == 1
    )
    ev = pd.DataFrame(
        [
            {"time": 100.0, "event": "slow", "session": 2, "queue_new": None, "queue_resume": None},
            {"time": 200.0, "event": "engage", "session": None, "queue_new": 0, "queue_resume": 0},
            {"time": 210.0, "event": "pause", "session": 1, "queue_new": 0, "queue_resume": 1},
            {"time": 260.0, "event": "resume", "session": 1, "queue_new": 3, "queue_resume": 0},
            {"time": 900.0, "event": "release", "session": None, "queue_new": 0, "queue_resume": 0},
        ]
    )
    slowed = M.trigger_outlived(tt, ss, ev, 1000.0, "slowed", 0.5)
    assert slowed["n"] == 1 and slowed["still_present"] == 1 and math.isnan(slowed["last_left"])
    ss["gate_wait"] = [0.0, 36.0, 0.0]
    ss["paused_time"] = [None, 3564.0, None]
    g = M.gate_summary(ev, ss, 1000.0)
    assert (g["engage"], g["release"], g["pauses"], g["resumes"], g["max_held"]) == (200.0, 900.0, 1.0, 1.0, 3.0)
    assert g["delay_h"] == pytest.approx(1.0) and g["slowed_sessions"] == 1 and g["unmatched_pauses"] == 0


def test_e0b_statistics() -> None:
    # 60 sessions arrive in the last 600 s and never leave: rising by 0.1 per second
    ss = sessions([(i, "base", 2400.0 + 10 * i, None, "unfinished") for i in range(60)])
    e = M.e0b_stability(ss, 3000.0, 10.0, 1500.0, 10.0)
    assert e["final"] == pytest.approx(60.0)  # the last arrival at 2990 s: all 60 present over [2990, 3000)
    # fitted rise over 1500 s: flat for 900 s then a ramp of slope 0.1 for 600 s
    assert 30 < e["rise"] < 90


def test_measures_evaluate_expressions_in_order() -> None:
    ss = sessions([(0, "burst", 10.0, 500.0, "completed"), (1, "base", 1000.0, 1500.0, "completed")])
    tt = turns([(0, 2, 400.0, 3000, 0), (1, 2, 1400.0, 3000, 2900)])
    t = RunTables(tt, ss, None, 2000.0, 0.1, hit_threshold=0.5, backlog_bin=10.0)
    out = measure_all(
        {
            "w": {"metric": "wave", "kind": "burst"},
            "c": {"metric": "completions", "start": "w.time", "end": "duration", "unit": "lambda_ref"},
            "h": {"metric": "followup_hit", "start": "arm.gate.t_on", "end": "duration"},
        },
        t,
        {"duration": 2000.0},
    )
    assert out["w.time"] == 500.0 and out["c"] == pytest.approx(2 / 1500.0 / 0.1)
    assert math.isnan(out["h"])  # an arm without a gate: no such window
