"""Model F's asymptotics against the paper's printed values (test vectors live only here).

Tolerances: a printed value with p decimals is matched to half a unit in its last place (the
rounding of the printed number), unless stated otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.theory.model_f import ModelF, model_f_from_cost
from analysis.theory.moments import survival, workload_moments
from harness.config import TurnLaw, WorkloadConfig
from harness.config.cost import CostModel

LAMBDA_REF = 0.071534  # registered E0a rate of the SGLang A100 300k cell
M300 = 300_000


def half_ulp(decimals: int) -> float:
    return 0.5 * 10.0**-decimals + 1e-12


@pytest.fixture(scope="module")
def std() -> ModelF:
    return model_f_from_cost(CostModel(), workload_moments(WorkloadConfig(name="standard")), M300)[0]


@pytest.fixture(scope="module")
def mirror() -> ModelF:
    wl = WorkloadConfig(name="mirror", turns=TurnLaw(mean=1000.0, cap=20))
    return model_f_from_cost(CostModel(), workload_moments(wl), M300)[0]


def test_all_miss_capacity(std: ModelF, mirror: ModelF) -> None:
    # "model F's all-miss capacity is 1.046 lambda_ref (1.004 for the standard one)"
    assert std.lambda_miss / LAMBDA_REF == pytest.approx(1.004, abs=half_ulp(3))
    assert mirror.lambda_miss / LAMBDA_REF == pytest.approx(1.046, abs=half_ulp(3))


def test_sglang_300k_at_165(std: ModelF) -> None:
    a = std.asymptotics(1.65 * LAMBDA_REF)
    assert a.rho == pytest.approx(1.64, abs=half_ulp(2))
    assert pytest.approx(0.989, abs=half_ulp(3)) == a.H
    assert a.Gamma == pytest.approx(1.236, abs=half_ulp(3))
    assert a.D_over_lambda_miss == pytest.approx(1.223, abs=half_ulp(3))
    assert a.D_over_lambda_miss == pytest.approx(a.H * a.Gamma, rel=1e-12)  # Theorem 2's product


def test_mirror_at_165(mirror: ModelF) -> None:
    a = mirror.asymptotics(1.65 * LAMBDA_REF)
    assert pytest.approx(0.699, abs=half_ulp(3)) == a.H
    assert a.Gamma == pytest.approx(1.103, abs=half_ulp(3))
    assert a.D_over_lambda_miss == pytest.approx(0.771, abs=half_ulp(3))
    assert pytest.approx(0.81, abs=half_ulp(2)) == a.D / LAMBDA_REF  # "0.81 lambda_ref asymptotically"
    assert a.alpha_over_excess == pytest.approx(1.4, abs=half_ulp(1))  # "1.4 times asymptotically"


@pytest.mark.parametrize(
    "mult, rho, prompt, gap, D_ref, alpha_ex, ps_ex",
    [(1.35, 1.34, 9324, 0.013, 1.13, 0.634, 0.647), (1.65, 1.64, 8606, 0.022, 1.23, 0.653, 0.666)],
)
def test_table3_and_ps(std: ModelF, mult, rho, prompt, gap, D_ref, alpha_ex, ps_ex) -> None:
    lam = mult * LAMBDA_REF
    a = std.asymptotics(lam)
    assert a.rho == pytest.approx(rho, abs=half_ulp(2))
    assert a.tilted_prompt == pytest.approx(prompt, abs=half_ulp(0))
    assert a.gap_slope_completion == pytest.approx(gap, abs=half_ulp(3))
    assert pytest.approx(D_ref, abs=half_ulp(2)) == a.D / LAMBDA_REF
    assert a.alpha_over_excess == pytest.approx(alpha_ex, abs=half_ulp(3))
    assert std.ps_backlog_growth(lam) / (lam - std.lambda_miss) == pytest.approx(ps_ex, abs=half_ulp(3))


def test_ranges_quoted_for_the_cells(std: ModelF) -> None:
    assert 17 <= std.c[-1] / std.c[0] <= 23
    assert 0.60 <= std.mean_T / std.k_bar_c <= 0.62
    for mult in (1.35, 1.65):
        lam = mult * LAMBDA_REF
        r = std.other_root_modulus(lam)
        assert 0.946 <= r <= 0.966
        assert 0.84 <= r / std.perron_root(lam) <= 0.95


@pytest.mark.parametrize("rho", [1 + 1e-9, 1 + 1e-6, 1.001, 1.04, 1.65, 3.0, 7.0])
def test_perron_root_robust(std: ModelF, rho: float) -> None:
    lam = rho * std.lambda_miss
    z = std.perron_root(lam)
    assert z > 1.0
    phi = lam * float(np.sum(std.c * std.G * z**-std.k))
    assert phi == pytest.approx(1.0, abs=1e-12)


def test_near_threshold_expansions(std: ModelF) -> None:
    # errors of the first-order forms shrink like (rho - 1)^2
    errs = []
    for eps in (1e-2, 1e-3):
        a = std.asymptotics((1 + eps) * std.lambda_miss)
        nt = std.near_threshold(1 + eps)
        errs.append(
            (abs(a.gamma - nt["gamma"]) / eps**2, abs(a.D_over_lambda_miss - nt["D_over_lambda_miss"]) / eps**2)
        )
        assert a.alpha_over_excess == pytest.approx(nt["alpha_over_excess"], rel=50 * eps)
    for i in range(2):
        assert errs[1][i] < 2 * errs[0][i] + 1e-9  # bounded second-order coefficient


def test_no_premium_for_geometric_T_with_constant_costs() -> None:
    G = survival(15.0, 3000)  # effectively untruncated
    mf = ModelF(c=np.ones_like(G), G=G, L=np.ones_like(G))
    a = mf.asymptotics(2.0 * mf.lambda_miss)
    assert pytest.approx(1.0, abs=1e-9) == a.H
    assert a.Gamma == pytest.approx(1.0, abs=1e-12)


def test_truncation_and_cost_growth_monotone(std: ModelF) -> None:
    q, K = 1 - 1 / 15, std.K
    prev_H, prev_G = 1.0, 1.0
    for rho in np.linspace(1.01, 6.0, 25):
        a = std.asymptotics(rho * std.lambda_miss)
        assert 1 - q**K < a.H < 1.0
        assert prev_H + 1e-15 >= a.H and a.Gamma >= prev_G - 1e-15
        prev_H, prev_G = a.H, a.Gamma


def test_slow_cost_growth_reverses_premium() -> None:
    G = survival(15.0, 60)
    k = np.arange(1, 61)
    mf = ModelF(c=1 + 1e-3 * (k - 1), G=G, L=k.astype(float))
    for rho in (1.05, 1.35, 1.65, 3.0, 6.0):
        assert mf.asymptotics(rho * mf.lambda_miss).D_over_lambda_miss < 1.0


def test_remark1_speed_invariance(std: ModelF) -> None:
    fast = std.scaled(2.742)
    for rho in (1.2, 1.65):
        a, b = std.asymptotics(rho * std.lambda_miss), fast.asymptotics(rho * fast.lambda_miss)
        assert b.z == pytest.approx(a.z, rel=1e-12)
        assert b.D_over_lambda_miss == pytest.approx(a.D_over_lambda_miss, rel=1e-12)


def test_corollary3_outcomes(std: ModelF) -> None:
    lam = 1.65 * LAMBDA_REF
    D = std.asymptotics(lam).D
    mid = 0.5 * (std.lambda_miss + D)  # inside [lambda_miss, D): below trapped throughput, no drain
    out = std.cut_outcome(lam, mid, V_tot=1000.0)
    assert out.regime == "grows" and out.below_trapped_throughput and math.isinf(out.time_to_empty)
    below = std.cut_outcome(lam, 0.9 * std.lambda_miss, V_tot=1000.0)
    assert below.regime == "drains" and below.time_to_empty == pytest.approx(1000.0 / 0.1, rel=1e-9)
    at = std.cut_outcome(lam, std.lambda_miss, V_tot=1000.0)
    assert at.regime == "settles" and at.settle_backlog > 0
    assert std.busy_period(1000.0, 0.0) == 1000.0  # arrivals stopped: V_tot itself
