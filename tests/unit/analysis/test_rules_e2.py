"""The registered E2 rule (analysis/rulespecs/e2.yaml), judged by the staged engine like every
family, on synthetic series: each state, precedence, and the per-rate pass in the paired layout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.expr import evaluate
from analysis.metrics import WINDOW_STATISTICS, MetricSpec, interval_bin_means, ls_slope, outstanding_at, run_statistics
from analysis.paired import paired_rates, paired_run
from analysis.rules import RuleError, load_rule
from analysis.stages import COUNTED, StagedRun, judge_staged, judge_staged_run

LAM_REF = 0.0715
ALL_MISS = 11243.0
E2 = load_rule("e2")
P = E2["params"]
SPEC = MetricSpec(
    window_start=5700.0,
    window_end=8700.0,
    duration=8700.0,
    backlog_bin=P["backlog_bin"],
    recovered_span=P["recovered_span"],
    hit_threshold=P["hit_threshold"],
    outstanding_stat=P["outstanding_stat"],
)


def refs(rate: float) -> dict[str, float]:
    return {"lam": rate * LAM_REF, "lam_miss": LAM_REF, "all_miss_rate": ALL_MISS, "rate": rate}


def synth(
    *,
    backlog0: float,
    slope: float,
    hit: float,
    token_rate: float,
    in_flight: int = 5,
    gated: int = 0,
    duration: float = 8700.0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sessions whose count in the window follows backlog0 + slope (t - 5700); a turn completes
    every second; a `hit` share of them is a hit; the uncached tokens add up to `token_rate`."""
    rows = []
    sid = 0
    # a standing population of backlog0 sessions that stay to the end
    for _ in range(int(backlog0)):
        rows.append(
            {"session": sid, "kind": "base", "arrival": 0.0, "admission": 0.0, "end": np.nan, "outcome": "unfinished"}
        )
        sid += 1
    if slope > 0:  # extra arrivals in the window that never end
        for t in np.arange(5700.0, duration, 1.0 / slope):
            rows.append(
                {"session": sid, "kind": "base", "arrival": t, "admission": t, "end": np.nan, "outcome": "unfinished"}
            )
            sid += 1
    elif slope < 0:  # part of the standing population leaves during the window
        leave = np.arange(5700.0, duration, -1.0 / slope)
        for i, t in enumerate(leave[: int(backlog0)]):
            rows[i]["end"] = t
            rows[i]["outcome"] = "completed"
    for _g in range(gated):
        rows.append(
            {
                "session": sid,
                "kind": "burst",
                "arrival": 100.0,
                "admission": np.nan,
                "end": np.nan,
                "outcome": "unfinished",
            }
        )
        sid += 1
    sessions = pd.DataFrame(rows)
    t = np.arange(0.5, duration, 1.0)
    n = len(t)
    prompt = np.full(n, 10000.0)
    k = np.arange(n)
    is_hit = (k % 1000) < round(hit * 1000)
    cached = np.where(is_hit, prompt - 551.0, 0.0)
    # scale misses so the total uncached rate matches token_rate
    n_miss = max(1, int((~is_hit).sum()))
    miss_unc = (token_rate * n - 551.0 * is_hit.sum()) / n_miss
    prompt = np.where(is_hit, prompt, np.maximum(miss_unc, 1.0))
    cached = np.where(is_hit, cached, 0.0)
    turns = pd.DataFrame(
        {
            "session": 0,
            "kind": "base",
            "turn": np.where(k % 10 == 0, 1, 2),
            "send_time": t - 0.4,
            "first_token_time": t - 0.1,
            "done_time": t,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "status": "ok",
        }
    )
    opens = pd.DataFrame(
        {
            "session": 0,
            "kind": "base",
            "turn": 3,
            "send_time": duration - 400.0 + np.arange(in_flight),
            "done_time": np.nan,
            "prompt_tokens": np.nan,
            "cached_tokens": np.nan,
            "status": "unfinished",
            "first_token_time": np.nan,
        }
    )
    return pd.concat([turns, opens], ignore_index=True), sessions


def view(spec: dict[str, Any], run: StagedRun) -> SimpleNamespace:
    """A run as the paired verdict lists it, with each state's conditions as (condition, holds) pairs."""
    r = paired_run(spec, run)
    r["conditions"] = {st: [(c["condition"], c["holds"]) for c in cs] for st, cs in r["conditions"].items()}
    return SimpleNamespace(**r)


def judge_stats(
    arm: str, rate: float, seed: int, stats: dict[str, Any], spec: dict[str, Any] = E2, **kw: Any
) -> SimpleNamespace:
    q = {**refs(rate), **stats}
    return view(spec, judge_staged_run(spec, arm, rate, seed, q, **kw))


def judge(rate: float, arm: str, turns: pd.DataFrame, sessions: pd.DataFrame, spec=E2, seed: int = 0):
    return judge_stats(arm, rate, seed, run_statistics(turns, sessions, None, SPEC), spec)


# ------------------------------------------------------------------ metrics primitives
def test_interval_bin_means_are_exact_time_averages() -> None:
    m = interval_bin_means(np.array([0.0, 5.0]), np.array([15.0, np.nan]), np.array([0.0, 10.0, 20.0]))
    assert m == pytest.approx([1.5, 1.5])  # [0,10): 1 + 0.5 ; [10,20): 0.5 + 1
    assert interval_bin_means(np.array([np.nan]), np.array([1.0]), np.array([0.0, 1.0])) == pytest.approx([0.0])


def test_ls_slope() -> None:
    x = np.arange(100.0)
    assert ls_slope(x, 3.0 + 0.25 * x) == pytest.approx(0.25)
    assert np.isnan(ls_slope(x[:1], x[:1]))


def test_outstanding_counts_in_flight_and_gated() -> None:
    turns, sessions = synth(backlog0=10, slope=0.0, hit=0.9, token_rate=1000.0, in_flight=7, gated=4)
    assert outstanding_at(turns, sessions, None, 8699.0) == 7 + 4


# ------------------------------------------------------------------ the run states
def test_trapped() -> None:
    turns, sessions = synth(backlog0=200, slope=0.03, hit=0.0, token_rate=1.02 * ALL_MISS, in_flight=150)
    v = judge(1.35, "BURST", turns, sessions)
    assert v.state == "TRAPPED" and v.good and v.flags["stuck"]
    assert v.stats["slope"] == pytest.approx(0.03, rel=0.02)
    assert v.stats["token_rate"] == pytest.approx(1.02 * ALL_MISS, rel=1e-3)


def test_stuck_but_flat_backlog_is_indeterminate() -> None:
    # the paper's 1.35 x seed 1: all-miss token rate, zero hits, backlog flat over the window
    turns, sessions = synth(backlog0=200, slope=0.0, hit=0.0, token_rate=1.01 * ALL_MISS, in_flight=150)
    v = judge(1.35, "BURST", turns, sessions)
    assert v.state == "INDETERMINATE" and not v.good and v.flags["stuck"]
    trapped = dict(v.conditions["TRAPPED"])
    assert trapped["slope > slope_factor * (lam - lam_miss)"] is False
    assert trapped["abs(token_rate / all_miss_rate - 1) <= rate_tolerance"] is True


def test_token_rate_outside_tolerance_is_not_trapped() -> None:
    turns, sessions = synth(backlog0=200, slope=0.03, hit=0.0, token_rate=0.80 * ALL_MISS, in_flight=150)
    assert judge(1.35, "BURST", turns, sessions).state == "INDETERMINATE"


def test_rate_below_lambda_miss_is_never_trapped() -> None:
    turns, sessions = synth(backlog0=200, slope=0.03, hit=0.0, token_rate=ALL_MISS, in_flight=150)
    assert judge(0.9, "BURST", turns, sessions).state == "INDETERMINATE"


def test_recovered_and_noburst_good() -> None:
    turns, sessions = synth(backlog0=10, slope=0.0, hit=0.93, token_rate=0.09 * ALL_MISS, in_flight=3)
    v = judge(1.65, "NOBURST", turns, sessions)
    assert v.state == "RECOVERED" and v.good and not v.flags["stuck"]
    assert judge(1.65, "CAPPED", turns, sessions).good
    assert not judge(1.65, "BURST", turns, sessions).good


def test_outstanding_blocks_recovered() -> None:
    turns, sessions = synth(backlog0=10, slope=0.0, hit=0.93, token_rate=0.09 * ALL_MISS, in_flight=3, gated=25)
    v = judge(1.65, "CAPPED", turns, sessions)
    assert v.state != "RECOVERED" and not v.good
    assert dict(v.conditions["RECOVERED"])["outstanding_last < recovered_outstanding"] is False


def test_draining() -> None:
    turns, sessions = synth(backlog0=300, slope=-0.05, hit=0.3, token_rate=0.7 * ALL_MISS, in_flight=100)
    v = judge(1.35, "BURST", turns, sessions)
    assert v.state == "DRAINING" and v.stats["slope"] < 0


def test_precedence_on_statistics() -> None:
    base = {
        "window_len": 3000.0,
        "token_rate": ALL_MISS,
        "slope": 0.05,
        "hit_last": 0.95,
        "outstanding_last": 3.0,
        "followup_hit": 0.9,
    }
    # trapped and recovered conditions both hold: trapped wins
    assert judge_stats("BURST", 1.65, 0, base).state == "TRAPPED"
    # recovered and draining both hold: recovered wins
    s2 = {**base, "token_rate": 0.1 * ALL_MISS, "slope": -0.01}
    assert judge_stats("NOBURST", 1.65, 0, s2).state == "RECOVERED"
    s3 = {**s2, "hit_last": 0.5}
    assert judge_stats("NOBURST", 1.65, 0, s3).state == "DRAINING"
    s4 = {**s3, "slope": 0.0}
    assert judge_stats("NOBURST", 1.65, 0, s4).state == "INDETERMINATE"


def test_nan_statistics_never_satisfy_a_condition() -> None:
    s = {
        "window_len": 3000.0,
        "token_rate": float("nan"),
        "slope": float("nan"),
        "hit_last": float("nan"),
        "outstanding_last": 0.0,
        "followup_hit": float("nan"),
    }
    v = judge_stats("NOBURST", 1.35, 0, s)
    assert v.state == "INDETERMINATE" and not v.flags["stuck"]


def test_short_window_is_invalid_and_failed_run_never_counts() -> None:
    s = {
        "window_len": 500.0,
        "token_rate": ALL_MISS,
        "slope": 1.0,
        "hit_last": 0.0,
        "outstanding_last": 300.0,
        "followup_hit": 0.0,
    }
    assert judge_stats("BURST", 1.35, 0, s).state == "INVALID"
    f = judge_stats("BURST", 1.35, 0, {**s, "window_len": 3000.0}, status="FAILED", reason="engine died")
    assert f.state == "FAILED" and not f.good and "engine died" in f.reason
    # an interrupted or partial run is FAILED in the paired layout, and shows no conditions
    p = judge_stats("BURST", 1.35, 0, {**s, "window_len": 3000.0}, status="PARTIAL")
    assert p.state == "FAILED" and p.conditions == {} and p.stats["window_len"] == 3000.0


def test_thresholds_are_data() -> None:
    turns, sessions = synth(backlog0=200, slope=0.03, hit=0.0, token_rate=0.80 * ALL_MISS, in_flight=150)
    loose = load_rule(None, overrides={"rate_tolerance": 0.25})
    assert judge(1.35, "BURST", turns, sessions, spec=loose).state == "TRAPPED"
    assert load_rule("e2")["params"]["rate_tolerance"] == 0.15  # the default spec is untouched


def test_rule_spec_validation_and_safe_expressions() -> None:
    with pytest.raises(RuleError):
        load_rule({**E2, "states": [{"name": "X", "all": ["__import__('os')"]}, {"name": "Y", "all": []}]})
    with pytest.raises(RuleError):
        load_rule({**E2, "states": [{"name": "X", "all": ["a > 1"]}]})  # no fallback state
    with pytest.raises(RuleError):
        evaluate("missing > 1", {})
    assert evaluate("abs(a - 1) <= 0.15", {"a": 1.1}) is True


# ------------------------------------------------------------------ per-rate pass
ARMS = ["burst", "noburst", "capped"]


def runs_for(states: dict[int, tuple[str, ...]], rate: float = 1.35, arms: list[str] = ARMS) -> list[StagedRun]:
    """Runs whose state is given: a rule state (counted), FAILED / INVALID (not counted), or MISSING (no run)."""
    out = []
    for seed, states_of in states.items():
        for arm, st in zip(arms, states_of):
            if st == "MISSING":
                continue
            status = COUNTED if st not in ("FAILED", "INVALID") else st
            out.append(StagedRun(arm, rate, seed, status, labels={"state": st}))
    return out


def judge_rate(rate: float, runs: list[StagedRun], arms: list[str], seeds: list[int]) -> dict[str, Any]:
    return paired_rates(E2, judge_staged(E2, runs, rates=[rate], seeds=seeds, arms=arms), runs, arms)[0]


def test_pass_needs_all_arms_in_the_same_seed() -> None:
    ok = ("TRAPPED", "RECOVERED", "RECOVERED")
    runs = runs_for({0: ok, 1: ("INDETERMINATE", "RECOVERED", "RECOVERED"), 2: ok})
    r = judge_rate(1.35, runs, ARMS, [0, 1, 2])
    assert r["verdict"] == "PASS" and r["good_seeds"] == [0, 2]
    assert r["reason"] == "2 of 3 seeds meet every arm condition"
    # conditions met in two seeds, but never all in the same seed
    runs = runs_for({0: ("TRAPPED", "DRAINING", "RECOVERED"), 1: ("INDETERMINATE", "RECOVERED", "RECOVERED"), 2: ok})
    r = judge_rate(1.35, runs, ARMS, [0, 1, 2])
    assert r["verdict"] == "FAIL" and r["good_seeds"] == [2]
    assert r["reason"] == "only 1 of 3 seeds meet every arm condition (need 2)"


def test_missing_seed_and_failed_run() -> None:
    ok = ("TRAPPED", "RECOVERED", "RECOVERED")
    # seed 2's BURST run is missing: two good seeds still pass
    r = judge_rate(1.35, runs_for({0: ok, 1: ok, 2: ("MISSING", "RECOVERED", "RECOVERED")}), ARMS, [0, 1, 2])
    assert r["verdict"] == "PASS" and r["seeds"]["2"]["burst"] == "MISSING"
    # one good seed, one failed run in an otherwise good seed: undecided, not FAIL
    r = judge_rate(
        1.35,
        runs_for({0: ok, 1: ("FAILED", "RECOVERED", "RECOVERED"), 2: ("INDETERMINATE", "RECOVERED", "RECOVERED")}),
        ARMS,
        [0, 1, 2],
    )
    assert r["verdict"] == "INCOMPLETE" and r["seeds"]["1"]["burst"] == "FAILED"
    assert r["reason"] == "1 of 3 seeds pass; 1 more could with their missing or failed runs"
    # a whole seed missing and another bad: cannot pass
    r = judge_rate(1.35, runs_for({0: ok, 1: ("DRAINING", "RECOVERED", "RECOVERED")}), ARMS, [0, 1, 2])
    assert r["verdict"] == "INCOMPLETE"
    r = judge_rate(
        1.35,
        runs_for({0: ok, 1: ("DRAINING", "RECOVERED", "RECOVERED"), 2: ("TRAPPED", "DRAINING", "RECOVERED")}),
        ARMS,
        [0, 1, 2],
    )
    assert r["verdict"] == "FAIL"


def test_a_seed_that_missed_an_arm_is_decided_whatever_its_failed_run() -> None:
    """NOBURST DRAINING fails seed 1 whatever its failed BURST run would have shown (decided_if), so
    one good seed out of three is FAIL, not INCOMPLETE."""
    ok = ("TRAPPED", "RECOVERED", "RECOVERED")
    runs = runs_for({0: ok, 1: ("FAILED", "DRAINING", "RECOVERED"), 2: ("INDETERMINATE", "RECOVERED", "RECOVERED")})
    r = judge_rate(1.35, runs, ARMS, [0, 1, 2])
    assert r["verdict"] == "FAIL" and r["good_seeds"] == [0]
    # without the DRAINING run the same seed is undecided again
    runs = runs_for({0: ok, 1: ("FAILED", "RECOVERED", "RECOVERED"), 2: ("INDETERMINATE", "RECOVERED", "RECOVERED")})
    assert judge_rate(1.35, runs, ARMS, [0, 1, 2])["verdict"] == "INCOMPLETE"


def test_a_run_whose_window_is_too_short_leaves_its_seed_undecided() -> None:
    """INVALID (window shorter than min_window) counts as no run: undecided, like every family's."""
    ok = ("TRAPPED", "RECOVERED", "RECOVERED")
    runs = runs_for({0: ok, 1: ("INVALID", "RECOVERED", "RECOVERED"), 2: ("INDETERMINATE", "RECOVERED", "RECOVERED")})
    r = judge_rate(1.35, runs, ARMS, [0, 1, 2])
    assert r["verdict"] == "INCOMPLETE" and r["seeds"]["1"]["burst"] == "INVALID"


def test_a_test_of_some_arms_judges_those() -> None:
    """The tutorial registers NOBURST alone: a seed is good when its NOBURST run recovers."""
    runs = runs_for({0: ("RECOVERED",), 1: ("DRAINING",), 2: ("RECOVERED",)}, arms=["noburst"])
    r = judge_rate(1.35, runs, ["noburst"], [0, 1, 2])
    assert r["verdict"] == "PASS" and r["good_seeds"] == [0, 2] and r["seeds"]["1"] == {"noburst": "DRAINING"}
    # a test that registers BURST too needs it in every seed
    r = judge_rate(1.35, runs, ["burst", "noburst"], [0, 1, 2])
    assert r["verdict"] == "INCOMPLETE" and r["seeds"]["0"] == {"burst": "MISSING", "noburst": "RECOVERED"}


def test_fewer_than_three_seeds_cannot_pass() -> None:
    ok = ("TRAPPED", "RECOVERED", "RECOVERED")
    r = judge_rate(1.35, runs_for({0: ok, 1: ok}), ARMS, [0, 1])
    assert r["verdict"] == "INCOMPLETE" and r["reason"] == "2 seeds registered; the rule needs at least 3"


def test_judge_test_overall() -> None:
    ok = ("TRAPPED", "RECOVERED", "RECOVERED")
    runs = runs_for({0: ok, 1: ok, 2: ok}, 1.35) + runs_for({0: ok, 1: ok, 2: ok}, 1.65)
    out = judge_staged(E2, runs, rates=[1.35, 1.65], seeds=[0, 1, 2], arms=ARMS)
    assert out["verdict"] == "PASS" and [g["outcome"] for g in out["groups"]] == ["PASS", "PASS"]
    bad = runs_for({0: ok, 1: ("DRAINING", "RECOVERED", "RECOVERED"), 2: ("DRAINING", "RECOVERED", "RECOVERED")}, 1.65)
    out = judge_staged(E2, runs_for({0: ok, 1: ok, 2: ok}, 1.35) + bad, rates=[1.35, 1.65], seeds=[0, 1, 2], arms=ARMS)
    assert out["verdict"] == "FAIL"
    out = judge_staged(E2, runs_for({0: ok}, 1.35), rates=[1.35], seeds=[0, 1, 2], arms=ARMS)
    assert out["verdict"] == "INCOMPLETE"


def test_window_statistics_names_every_statistic() -> None:
    """The names a spec may read of every run (analysis/quantities.py) are run_statistics' keys."""
    turns, sessions = synth(backlog0=10, slope=0.0, hit=0.9, token_rate=1000.0)
    assert tuple(run_statistics(turns, sessions, None, SPEC)) == WINDOW_STATISTICS


def test_the_speed_pins_probe_and_recheck_are_run_quantities_nan_where_absent() -> None:
    """pin_start / pin_after (analysis/quantities.py SPEED_PIN) from meta.json's engine_speed_pin: the
    ratios when the pin settled and the recheck probed; NaN for a cell without a pin, a server that
    was not pinned (attached), a refused pin, and a recheck that did not probe (engine still busy)."""
    import math

    from analysis.quantities import RUN_QUANTITIES, SPEED_PIN
    from analysis.staged_analysis import speed_pin_quantities

    assert set(SPEED_PIN) <= RUN_QUANTITIES
    pinned = {"applied": True, "pinned": True, "ratio": 1.041, "after": {"token_rate": 8245.0, "ratio": 1.434}}
    assert speed_pin_quantities({"engine_speed_pin": pinned}) == {"pin_start": 1.041, "pin_after": 1.434}
    busy = {**pinned, "after": {"skipped": "not probed: the engine was still busy 30 s after the run"}}
    q = speed_pin_quantities({"engine_speed_pin": busy})
    assert q["pin_start"] == 1.041 and math.isnan(q["pin_after"])
    for meta in (
        {},
        {"engine_speed_pin": None},
        {"engine_speed_pin": {"applied": False, "reason": "attached server"}},
        {"engine_speed_pin": {"applied": True, "pinned": False, "ratio": None, "reason": "host too slow"}},
        {"engine_speed_pin": {**pinned, "after": {"error": "ClientConnectorError"}, "pinned": False}},
    ):
        assert all(math.isnan(v) for v in speed_pin_quantities(meta).values()), meta


def test_a_rule_can_refuse_to_count_a_run_whose_pinned_speed_did_not_hold() -> None:
    """e2-cpu-sglang-16k version 2's count_if, evaluated on the quantities alone: a recheck within
    recheck_tolerance (or none) counts, one outside it does not, whatever the state would be."""
    from analysis.expr import evaluate
    from analysis.rules import load_rule

    spec = load_rule("e2-cpu-sglang-16k")
    (cond,) = spec["run"]["count_if"]
    tol = spec["params"]["recheck_tolerance"]
    for after, counts in ((1.0, True), (0.871, True), (1.15, True), (1.434, False), (0.84, False)):
        assert bool(evaluate(cond, {"pin_after": after, "recheck_tolerance": tol})) is counts, after
    assert bool(evaluate(cond, {"pin_after": float("nan"), "recheck_tolerance": tol}))
