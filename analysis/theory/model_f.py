"""Model F (paper §3, App. A): the all-miss FIFO re-entrant fluid and its asymptotic laws.

Why: a trapped engine misses every turn, serves requests in arrival order and sends each finished
turn back to the tail of the queue; model F idealizes exactly that, and its Perron root z fixes the
trapped state's gap growth, backlog growth, completion rate and turn mix with nothing fitted to any
trap measurement. Predictions are frozen from these functions, so every quantity is computed from
the cost vector and the turn law alone.

Costs: c_k = t_k^m + delta, the miss prefill of turn k plus one all-miss decode share per turn,
with delta chosen so that the turn-mix mean of c equals 1/nu_b, the all-miss turn rate of the entry
model (App. E.9). Then lambda_miss = 1/sum_k c_k G_k equals the entry model's mu_b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.arrays import FloatArray
from analysis.theory.entry import Batching, Server, all_miss_onset
from analysis.theory.moments import WorkloadMoments
from harness.config.cost import CostModel


@dataclass(frozen=True)
class ModelF:
    """Costs and turn law of model F. Arrays indexed k-1, k = 1..K."""

    c: FloatArray  # all-miss GPU seconds of turn k
    G: FloatArray  # P(T >= k)
    L: FloatArray  # prompt of turn k (tokens), for the served-prompt statistic
    t_miss: FloatArray | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        c, G = np.asarray(self.c, float), np.asarray(self.G, float)
        if c.shape != G.shape or c.ndim != 1:
            raise ValueError("c and G must be 1-d arrays of equal length")
        if np.any(c <= 0) or G[0] != 1.0 or G[-1] <= 0 or np.any(np.diff(G) > 0):
            raise ValueError("need c_k > 0 and 1 = G_1 >= ... >= G_K > 0")

    # -- basic quantities ------------------------------------------------------------------------
    @property
    def K(self) -> int:
        return int(self.c.size)

    @property
    def k(self) -> FloatArray:
        return np.arange(1, self.K + 1, dtype=float)

    @property
    def pmf(self) -> FloatArray:
        nxt: FloatArray = np.append(self.G[1:], 0.0)
        return self.G - nxt

    @property
    def r(self) -> FloatArray:
        return np.append(self.G[1:], 0.0) / self.G

    @property
    def mean_T(self) -> float:
        return float(self.G.sum())

    @property
    def work_per_session(self) -> float:
        """sum_k c_k G_k: the all-miss work a new session brings."""
        return float(np.dot(self.c, self.G))

    @property
    def lambda_miss(self) -> float:
        return 1.0 / self.work_per_session

    @property
    def remaining_work(self) -> FloatArray:
        """R_k = sum_{j>=k} c_j G_j / G_k: remaining all-miss work of a session whose next turn is k."""
        return np.cumsum((self.c * self.G)[::-1])[::-1] / self.G

    @property
    def omega(self) -> FloatArray:
        """Cost-weighted turn mix omega_k = c_k G_k / sum_j c_j G_j (Remark 1)."""
        cg = self.c * self.G
        return cg / float(cg.sum())

    @property
    def k_bar_c(self) -> float:
        """Cost-weighted mean turn index."""
        return float(np.dot(self.k, self.omega))

    def rho(self, lam: float) -> float:
        return lam / self.lambda_miss

    def scaled(self, speed: float) -> ModelF:
        """Every cost divided by `speed` (a uniform GPU speed-up)."""
        return ModelF(c=self.c / speed, G=self.G, L=self.L)

    # -- Perron root ---------------------------------------------------------------------------
    def perron_root(self, lam: float) -> float:
        """The unique z > 0 with lam sum_k c_k G_k z^-k = 1 (Lemma 2); z > 1 iff rho > 1.

        Solved for y = ln z with a log-sum-exp objective, which stays well conditioned from rho
        just above 1 (z - 1 ~ (rho - 1)/k_bar_c) to heavy overload; z <= max(rho, 1) brackets it.
        """
        if lam <= 0:
            raise ValueError("lambda must be positive")
        from scipy.optimize import brentq  # deferred: scipy costs a command ~0.3 s to import
        from scipy.special import logsumexp

        la = np.log(lam * self.c * self.G)
        k = self.k

        def psi(y: float) -> float:
            return float(logsumexp(la - k * y))

        rho = self.rho(lam)
        if rho == 1.0:
            return 1.0
        lo, hi = (0.0, math.log(rho)) if rho > 1 else (math.log(rho) / k[-1] * 2.0, 0.0)
        while psi(lo) < 0:
            lo -= 1.0
        while psi(hi) > 0:
            hi += 1.0
        y = brentq(psi, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
        return math.exp(y)

    def other_root_modulus(self, lam: float) -> float:
        """r: largest modulus of the roots of x^K = sum_k a_k x^{K-k} other than z (Theorem 1(b))."""
        a = lam * self.c * self.G
        roots = np.roots(np.concatenate(([1.0], -a)))
        z = self.perron_root(lam)
        i = int(np.argmin(np.abs(roots - z)))
        others = np.delete(roots, i)
        return float(np.max(np.abs(others))) if others.size else 0.0

    # -- asymptotics ----------------------------------------------------------------------------
    def asymptotics(self, lam: float) -> Asymptotics:
        """Theorem 1(a) and Theorem 2 at arrival rate lam (rho > 1 for the trapped quantities)."""
        z = self.perron_root(lam)
        zk = z**-self.k
        Ez = float(np.dot(self.pmf, zk))
        tilt = self.G * zk
        nu_z = tilt / tilt.sum()
        nu = self.G / self.mean_T
        H = self.mean_T * Ez / float(tilt.sum())
        Gamma = float(np.dot(nu, self.c)) / float(np.dot(nu_z, self.c))
        return Asymptotics(
            lam=lam,
            lambda_miss=self.lambda_miss,
            rho=self.rho(lam),
            z=z,
            gamma=z - 1.0,
            alpha=lam * (1.0 - Ez),
            D=lam * Ez,
            E_z_T=Ez,
            nu_z=nu_z,
            H=H,
            Gamma=Gamma,
            tilted_prompt=float(np.dot(nu_z, self.L)),
            stationary_prompt=float(np.dot(nu, self.L)),
            k_bar_c=self.k_bar_c,
            mean_T=self.mean_T,
        )

    # -- near-threshold expansions (Proposition 1(c), Theorem 2) -------------------------------
    def near_threshold(self, rho: float) -> dict[str, float]:
        """First-order predictions as rho -> 1: gamma, alpha/(lam - lam_miss), D/lam_miss."""
        kc, ET = self.k_bar_c, self.mean_T
        return {
            "gamma": (rho - 1.0) / kc,
            "alpha_over_excess": ET / kc,
            "D_over_lambda_miss": 1.0 + (rho - 1.0) * (1.0 - ET / kc),
        }

    def critical_limits(self, V_tot: float) -> dict[str, float]:
        """Proposition 1(b), rho = 1: V -> V_tot/k_bar_c, N -> lam E[T] V_tot / k_bar_c."""
        kc = self.k_bar_c
        return {"V": V_tot / kc, "N": self.lambda_miss * self.mean_T * V_tot / kc}

    # -- busy period and Corollary 3 -----------------------------------------------------------
    def busy_period(self, V_tot: float, lam: float) -> float:
        """Time to empty from remaining work V_tot at rate lam: V_tot/(1 - rho) if rho < 1, else inf.

        With lam = 0 (arrivals stopped) this is V_tot itself (Proposition 1(a)).
        """
        rho = self.rho(lam) if lam > 0 else 0.0
        return V_tot / (1.0 - rho) if rho < 1.0 else math.inf

    def cut_outcome(self, lam_before: float, lam_after: float, V_tot: float) -> CutOutcome:
        """Corollary 3: a cut from lam_before to lam_after with remaining work V_tot at the cut."""
        rho_p = self.rho(lam_after)
        D_before = self.asymptotics(lam_before).D if self.rho(lam_before) > 1 else lam_before
        if rho_p < 1.0:
            regime, T_empty, growth, settle = "drains", self.busy_period(V_tot, lam_after), 0.0, 0.0
        elif rho_p > 1.0:
            regime, T_empty = "grows", math.inf
            growth, settle = self.asymptotics(lam_after).alpha, math.inf
        else:
            regime, T_empty, growth = "settles", math.inf, 0.0
            settle = self.critical_limits(V_tot)["N"]
        return CutOutcome(
            rho_after=rho_p,
            regime=regime,
            time_to_empty=T_empty,
            backlog_growth=growth,
            settle_backlog=settle,
            below_trapped_throughput=lam_after < D_before,
        )

    # -- processor-sharing variant (App. A remark) ---------------------------------------------
    def ps_exponent(self, lam: float) -> float:
        """alpha_PS solving lam sum_k c_k G_k int_{k-1}^{k} e^{-alpha a} da = 1 (Euler-Lotka)."""
        if self.rho(lam) <= 1.0:
            raise ValueError("the PS exponent is positive only for rho > 1")
        from scipy.optimize import brentq

        a = lam * self.c * self.G
        k = self.k

        def g(x: float) -> float:
            seg = np.exp(-x * (k - 1.0)) * (-np.expm1(-x)) / x
            return float(np.dot(a, seg)) - 1.0

        hi = 1.0
        while g(hi) > 0:
            hi *= 2.0
        return float(brentq(g, 1e-14, hi, xtol=1e-15))

    def ps_backlog_growth(self, lam: float) -> float:
        x = self.ps_exponent(lam)
        return lam * (1.0 - float(np.dot(self.pmf, np.exp(-x * self.k))))

    # -- stochastic version (Kendall) ----------------------------------------------------------
    def kendall_empty_probability(self, lam: float, remaining: float, level: float = 0.0) -> float:
        """P(the all-miss workload ever falls to `level`) from realized remaining work, Poisson arrivals.

        xi is the least root of xi = E[exp(-lam W_T (1 - xi))], W_T = sum_{k<=T} c_k.
        """
        from scipy.optimize import brentq

        W = np.cumsum(self.c)
        pmf = self.pmf
        if self.rho(lam) <= 1.0:
            return 1.0
        # with s = 1 - xi: E[exp(-lam W s)] - 1 + s = 0, negative for small s > 0 when rho > 1

        def g(s: float) -> float:
            return float(np.dot(pmf, np.expm1(-lam * W * s))) + s

        lo = 1e-3
        while g(lo) >= 0.0:
            lo /= 10.0
        s = brentq(g, lo, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps)
        return math.exp(-lam * s * (remaining - level))


@dataclass(frozen=True)
class Asymptotics:
    lam: float
    lambda_miss: float
    rho: float
    z: float
    gamma: float
    alpha: float
    D: float
    E_z_T: float
    nu_z: np.ndarray
    H: float
    Gamma: float
    tilted_prompt: float
    stationary_prompt: float
    k_bar_c: float
    mean_T: float

    @property
    def D_over_lambda_miss(self) -> float:
        return self.D / self.lambda_miss

    @property
    def gap_slope_completion(self) -> float:
        """Slope of the gap regressed on the turn's completion time, gamma/z = 1 - 1/z."""
        return 1.0 - 1.0 / self.z

    @property
    def alpha_over_excess(self) -> float:
        return self.alpha / (self.lam - self.lambda_miss)

    def summary(self) -> dict[str, float]:
        return {
            "lambda": self.lam,
            "lambda_miss": self.lambda_miss,
            "rho": self.rho,
            "z": self.z,
            "gamma": self.gamma,
            "gap_slope_completion": self.gap_slope_completion,
            "alpha": self.alpha,
            "alpha_over_excess": self.alpha_over_excess,
            "D": self.D,
            "D_over_lambda_miss": self.D_over_lambda_miss,
            "H": self.H,
            "Gamma": self.Gamma,
            "E_z_T": self.E_z_T,
            "tilted_prompt": self.tilted_prompt,
            "stationary_prompt": self.stationary_prompt,
            "k_bar_c": self.k_bar_c,
            "E_T_over_k_bar_c": self.mean_T / self.k_bar_c,
        }


@dataclass(frozen=True)
class CutOutcome:
    rho_after: float
    regime: str  # 'drains' | 'grows' | 'settles'
    time_to_empty: float
    backlog_growth: float
    settle_backlog: float
    below_trapped_throughput: bool


def model_f_from_cost(
    cost: CostModel, mom: WorkloadMoments, pool_tokens: float, batching: Batching = "separate"
) -> tuple[ModelF, float]:
    """Model F's costs for a cell: c_k = t_P(L_k, 0) + delta with sum_k w_k c_k = 1/nu_b.

    Returns (model, nu_b). The decode share delta is the all-miss decode time per turn implied by
    the entry model's all-miss state, so model F and the entry model share one lambda_miss.
    """
    server = Server(cost, mom, batching)
    onset = all_miss_onset(server, pool_tokens)
    t_m = server.t_miss
    delta = 1.0 / onset.nu_b - float(np.dot(mom.w, t_m))
    if delta <= 0:
        raise ValueError(f"non-positive decode share delta = {delta}")
    return ModelF(c=t_m + delta, G=mom.G, L=mom.L, t_miss=t_m, delta=delta), onset.nu_b
