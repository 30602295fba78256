"""Workload moments, the first-principles entry model and the quasi-static model.

Paper numbers are test vectors: matched to half a unit in the last printed place unless a
tolerance is stated with its reason.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.theory.entry import (
    Server,
    all_miss_onset,
    critical_fresh_burst,
    onset_speed_law,
    predicted_curve,
    queue_free_state,
)
from analysis.theory.moments import workload_moments
from analysis.theory.quasistatic import MuCurve
from harness.config import WorkloadConfig
from harness.config.cost import CostModel

H200_SPEED = 2.742


def half_ulp(decimals: int) -> float:
    return 0.5 * 10.0**-decimals + 1e-12


@pytest.fixture(scope="module")
def mom():
    return workload_moments(WorkloadConfig(name="standard"))


@pytest.fixture(scope="module")
def server(mom):
    return Server(CostModel(), mom, "separate")


def test_workload_moments(mom) -> None:
    assert mom.mean_T == pytest.approx(14.761, abs=half_ulp(3))
    assert mom.mean_W == pytest.approx(154_529, abs=half_ulp(0))
    assert mom.E_bar == pytest.approx(10_569, abs=half_ulp(0))
    assert pytest.approx(144_960, abs=half_ulp(0)) == mom.A1
    assert mom.mean_ET == pytest.approx(11_045, abs=half_ulp(0))
    assert mom.hit_ceiling == pytest.approx(1 - 1 / mom.mean_T)
    assert mom.w.sum() == pytest.approx(1.0)
    # H3's per-session peak footprint: 4,331 tokens at turn 12
    assert float(mom.footprint_by_turn.max()) == pytest.approx(4_331, abs=half_ulp(0))
    assert int(np.argmax(mom.footprint_by_turn)) + 1 == 12


def test_onset_300k(server, mom) -> None:
    on = all_miss_onset(server, 300_000)
    assert on.tool_term == pytest.approx(4.94, abs=half_ulp(2))
    assert on.pool_term == pytest.approx(27.76, abs=half_ulp(2))
    assert on.n_b == pytest.approx(32.70, abs=half_ulp(2))
    assert pytest.approx(10_800, rel=0.01) == on.E_S  # "about 10.8k tokens"
    assert on.mu_b == pytest.approx(on.nu_b / mom.mean_T)


def test_onset_h200_and_speed_law(server, mom) -> None:
    on1 = all_miss_onset(server, 300_000)
    fast = all_miss_onset(Server(CostModel().scaled(speed=H200_SPEED), mom), 300_000)
    assert fast.n_b == pytest.approx(41.3, abs=half_ulp(1))
    # Proposition 3(c) holds exactly in the model: nu_b scales, E_S is invariant
    assert fast.n_b == pytest.approx(onset_speed_law(on1, H200_SPEED, mom.tool_per_turn), rel=1e-9)
    assert fast.nu_b == pytest.approx(H200_SPEED * on1.nu_b, rel=1e-9)
    assert pytest.approx(on1.E_S, rel=1e-9) == fast.E_S


@pytest.mark.parametrize("M, pool_term, decimals", [(150_000, 13.6, 1), (600_000, 56.1, 1), (955_757, 89.8, 1)])
def test_pool_terms(mom, M, pool_term, decimals) -> None:
    assert all_miss_onset(Server(CostModel(), mom), M).pool_term == pytest.approx(pool_term, abs=half_ulp(decimals))


def test_native_onset(mom) -> None:
    assert all_miss_onset(Server(CostModel(), mom), 955_757).n_b == pytest.approx(94.86, abs=half_ulp(2))


def test_lemma5_monotonicity(server) -> None:
    nus = np.linspace(0.1, 0.99 * server.nu_cap(0.0), 8)
    k0 = [server.k_run(float(n), 0.0) for n in nus]
    assert np.all(np.diff(k0) > 0)
    for nu in (0.3, 0.8):
        ks = [server.k_run(nu, h) for h in (0.0, 0.5, 0.9)]
        assert ks[0] > ks[1] > ks[2]
    assert server.decode_time_per_turn(server.nu_cap(0.0) * (1 - 1e-9), 0.0) > 1e3


def test_queue_free_branch_meets_onset(server) -> None:
    on = all_miss_onset(server, 300_000)
    p = queue_free_state(server, 300_000, 1e-7)
    assert p.n == pytest.approx(on.n_b, rel=1e-4)
    assert p.nu == pytest.approx(on.nu_b, rel=1e-4)


def test_prop4a_capacity_scales_with_speed(mom) -> None:
    base = all_miss_onset(Server(CostModel(), mom), 300_000).mu_b
    for s in (0.5, 2.0, 2.742):
        assert all_miss_onset(Server(CostModel().scaled(speed=s), mom), 300_000).mu_b == pytest.approx(
            s * base, rel=1e-9
        )


@pytest.mark.parametrize("M, paper", [(300_000, 31.5), (150_000, 16.9), (600_000, 60.0), (955_757, 93.7)])
def test_half_hit_crossing(mom, M, paper) -> None:
    # Reimplementation tolerance 1.5% (the decode context ybar_D is our definition; the paper's
    # frozen crossings carried +-3 sessions). Observed: +0.15 to +0.19 sessions on these cells.
    curve = predicted_curve(Server(CostModel(), mom), M, n_points=40)
    assert curve.crossing(0.5) == pytest.approx(paper, rel=0.015)
    assert not curve.folds


def test_h200_crossing_within_frozen_tolerance(mom) -> None:
    # the paper froze 37.3 +- 3 for the H200 at 300k; we get ~37.9 (a 0.6-session difference)
    curve = predicted_curve(Server(CostModel().scaled(speed=H200_SPEED), mom), 300_000, n_points=40)
    assert abs(curve.crossing(0.5) - 37.3) <= 3.0


def test_vllm_mixed_server_defined(mom) -> None:
    srv = Server(CostModel(token_factor=1.0882), mom, "mixed")
    on = all_miss_onset(srv, 300_000)
    assert math.isfinite(on.n_b) and 25 < on.n_b < 40


def test_h3_core(mom) -> None:
    # (n2 - n1) E_S / peak footprint; with the paper's n2 - n1 = 21.3 this gives ~53 (paper: 53.4)
    b = critical_fresh_burst(mom, 0.0, 21.3, 10_808.8)
    assert b == pytest.approx(53.4, rel=0.01)


# -- quasi-static model --------------------------------------------------------------------------
@pytest.fixture()
def curve() -> MuCurve:
    n = np.arange(1, 61)
    mu = np.where(n <= 24, 0.01 * n, np.maximum(0.24 - 0.02 * (n - 24), 0.07))
    return MuCurve.from_points(n, mu)


def test_unimodal_and_fixed_points(curve: MuCurve) -> None:
    u = curve.unimodality()
    assert u.ok and u.n_star == 24 and u.mu_star == pytest.approx(0.24) and u.mu_inf == pytest.approx(0.07)
    lam = 0.12
    assert curve.n1(lam) == pytest.approx(12.0)
    assert curve.n2(lam) == pytest.approx(30.0)
    assert math.isnan(curve.n2(0.05)) and math.isnan(curve.n1(0.3))
    assert curve.window(lambda_e=0.2) == (pytest.approx(0.07), 0.2)


def test_cap_condition_is_mu_of_cap(curve: MuCurve) -> None:
    lam = 0.12
    for c in range(1, 60):
        assert curve.cap_rescues(c, lam) == (curve.n1(lam) < c < curve.n2(lam))


def test_gate_drain_and_stop(curve: MuCurve) -> None:
    d = curve.gate_drain_time(20, 0.12, 200)
    assert d["refined"] == pytest.approx((12 + 200 - 20) / (0.20 - 0.12))
    assert d["crude"] == pytest.approx(200 / 0.08)
    # constant tail: time from 100 to 40 at mu = 0.07
    assert curve.stop_drain_time(100, 40) == pytest.approx(60 / 0.07)
    _t, n = curve.integrate(100.0, lambda _t: 0.0, 60 / 0.07, dt=0.5)
    assert n[-1] == pytest.approx(40.0, abs=1e-6)


def test_non_unimodal_detected() -> None:
    c = MuCurve.from_points([1, 2, 3, 4], [0.1, 0.3, 0.2, 0.25])
    assert not c.unimodality().ok
