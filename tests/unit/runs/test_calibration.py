"""Calibration statistics, and the simulator's Stage C and E0a against the paper's SGLang 300k cell."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.calibration import curve_means, e0a_summary, hit_crossing, window_stats
from harness.config import CellConfig, WorkloadConfig, load_config
from runs.closed_runs import STAGE_C_NS, e0a, stage_c

PAPER_ALL_MISS_TOKENS = 11_243.0  # tokens/s, E0a on the A100 (App. E.3)
PAPER_LAMBDA_REF = 0.0715  # sessions/s, turns-based


def test_window_stats_counts_only_the_window():
    turns = pd.DataFrame(
        {
            "done_time": [10.0, 100.0, 150.0, 199.0, 250.0],
            "status": ["ok", "ok", "ok", "error", "ok"],
            "prompt_tokens": [1000, 1000, 2000, 3000, 1000],
            "cached_tokens": [999, 0, 1500, None, 600],
        }
    )
    sessions = pd.DataFrame(
        {"end": [50.0, 120.0, 180.0, None], "outcome": ["completed", "completed", "failed", "unfinished"]}
    )
    s = window_stats(turns, sessions, 100.0, 200.0, expected_turns=2.0)
    assert s.turns_completed == 2 and s.sessions_completed == 1
    assert s.mu_sessions == pytest.approx(0.01) and s.mu_turns == pytest.approx(2 / 100 / 2)
    assert s.hit_fraction == pytest.approx(0.5)
    assert s.uncached_token_rate == pytest.approx((1000 + 500) / 100)
    assert s.token_hit_fraction == pytest.approx(1500 / 3000)


def test_hit_crossing_interpolates():
    assert hit_crossing([16, 24, 32, 48], [0.93, 0.89, 0.51, 0.0]) == pytest.approx(32.0 + 0.01 / 0.51 * 16)
    assert math.isnan(hit_crossing([16, 24], [0.9, 0.8]))


def test_e0a_summary_means_and_errors():
    from analysis.calibration import WindowStats

    mk = lambda mu, tok: WindowStats(32, 0, 900, 2700, 100, 1000, mu, mu, 0.0, 0.0, tok, tok)  # noqa: E731
    s = e0a_summary([mk(0.07, 11000), mk(0.08, 11200)])
    assert s.lambda_ref == pytest.approx(0.075) and s.lambda_ref_se == pytest.approx(0.005)
    assert s.all_miss_token_rate == pytest.approx(11100)


@pytest.fixture(scope="module")
def sglang_300k() -> tuple[CellConfig, WorkloadConfig]:
    return load_config("cells/sglang-a100-300k", CellConfig), load_config("workloads/standard", WorkloadConfig)


@pytest.mark.slow
def test_e0a_reproduces_the_all_miss_token_rate(sglang_300k):
    cell, wl = sglang_300k
    s = e0a(cell, wl, seeds=(0, 1), n=32, check_n=None)
    assert abs(s.all_miss_token_rate / PAPER_ALL_MISS_TOKENS - 1) < 0.10
    assert abs(s.lambda_ref / PAPER_LAMBDA_REF - 1) < 0.25  # session counts vary ±17% across seeds


@pytest.mark.slow
def test_stage_c_has_the_papers_shape(sglang_300k):
    cell, wl = sglang_300k
    m = curve_means(stage_c(cell, wl, STAGE_C_NS, seeds=(0,))).set_index("n")
    peak_n = int(m["mu_sessions"].idxmax())
    assert peak_n in (20, 24)
    assert m.loc[16, "hit_fraction"] > 0.9 and m.loc[20, "hit_fraction"] > 0.85
    assert 28 <= hit_crossing(list(m.index), list(m["hit_fraction"])) <= 36
    mu_star = m["mu_sessions"].max()
    for n in (48, 96):  # the all-miss plateau: no hits, a fraction of the peak
        assert m.loc[n, "hit_fraction"] < 0.05
        assert m.loc[n, "mu_sessions"] < 0.45 * mu_star
    assert m.loc[300, "hit_fraction"] == 0.0
