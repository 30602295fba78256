"""First-principles entry model (paper App. E.9): the thrashing curve mu(n) from the pool, the
workload, the tool-time law and the iteration-cost model, with nothing fitted to any mu(n) point.

Why this layer exists: model F describes the trap once every turn misses; this model says where the
all-miss state becomes possible (the onset n_b) and what the good state's throughput curve looks
like, which places registered test rates and caps before any engine run. It also supplies model F's
all-miss capacity: the decode share delta of the turn costs is fixed by the all-miss turn rate nu_b.

Conventions. Rates nu are turns/s, mu = nu / E[T] sessions/s. h is the follow-up hit probability.
Every GPU time comes from the shared `CostModel`; where a closed form needs the intercept or slope
of an iteration cost, it is read off the cost model by evaluating it, never re-derived here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from analysis.arrays import FloatArray
from analysis.theory.moments import WorkloadMoments
from harness.config.cost import CostModel, causal_pairs

Batching = Literal["separate", "mixed"]


# ---------------------------------------------------------------------------------------------
# server (S1-S4)
# ---------------------------------------------------------------------------------------------
def decode_context(mom: WorkloadMoments) -> float:
    """Mean context of a decoding request, ybar_D.

    Every turn decodes for the same time S_D, so decoding requests are in proportion to the turn
    mix w_k; a request of turn k decodes from context L_k to L_k + d - 1, on average L_k + d/2.
    Hence ybar_D = sum_k w_k L_k + d/2 (the same for every h and nu).
    """
    return mom.mean_prompt + mom.d / 2.0


def _affine(fn: Callable[[float], float], x_hi: float) -> tuple[float, float]:
    """Intercept and slope of a cost that is affine beyond its floor, read at x_hi and 2 x_hi."""
    y1, y2 = fn(x_hi), fn(2.0 * x_hi)
    slope = (y2 - y1) / x_hi
    return y1 - slope * x_hi, slope


@dataclass(frozen=True)
class Server:
    """The fluid server of Lemma 5 for one cell and workload.

    SGLang ('separate'): prefill and decode run in separate iterations with prefill priority.
    vLLM ('mixed'): one iteration carries prefill chunks and one token per decoding request.
    """

    cost: CostModel
    mom: WorkloadMoments
    batching: Batching = "separate"

    # -- per-turn prefill ----------------------------------------------------------------------
    @property
    def t_miss(self) -> FloatArray:
        """t_k^m = t_P(L_k, 0): a turn that misses prefills its whole prompt."""
        return np.array([self.cost.prefill_time(float(L), 0.0) for L in self.mom.L], dtype=float)

    @property
    def t_hit(self) -> FloatArray:
        """t_k^h = t_P(Delta + 1, L_k - Delta - 1) for k >= 2; turn 1 always misses."""
        x = self.mom.delta + 1
        out = np.array([self.cost.prefill_time(float(x), float(L - x)) for L in self.mom.L], dtype=float)
        out[0] = self.t_miss[0]
        return out

    def t_turn(self, h: float) -> FloatArray:
        """t_k(h): expected prefill time of turn k at follow-up hit probability h."""
        tm, th = self.t_miss, self.t_hit
        out = tm - h * (tm - th)
        out[0] = tm[0]
        return out

    def t_bar(self, h: float) -> float:
        return float(np.dot(self.mom.w, self.t_turn(h)))

    @property
    def y_decode(self) -> float:
        return decode_context(self.mom)

    # -- decode ------------------------------------------------------------------------------
    def _decode_slope(self) -> float:
        """Asymptotic seconds per decoding request of one decode iteration (b + b_att)/speed."""
        big = 1e6
        return _affine(lambda r: self.cost.decode_time(r, self.y_decode), big)[1]

    def _mixed_parts(self, h: float) -> tuple[float, float]:
        """(a, c_turn) of the mixed server: iteration intercept and token-proportional time per turn.

        c_turn = b xbar + c_p pibar + (b + b_att)(d - 1) + c_r is read off `mixed_iteration` by scaling
        a turn's tokens, pairs, decode context and its one admission up N-fold (affine region) and
        taking the slope.
        """
        mom = self.mom
        x_miss, x_hit = mom.L, np.full_like(mom.L, mom.delta + 1)
        x_hit[0] = mom.L[0]
        p_miss = np.array([causal_pairs(int(L), 0) for L in mom.L])
        p_hit = np.array([causal_pairs(int(x), int(L - x)) for x, L in zip(x_hit, mom.L)])
        hk = np.full(mom.K, h)
        hk[0] = 0.0
        x_bar = float(np.dot(mom.w, x_miss - hk * (x_miss - x_hit)))
        pi_bar = float(np.dot(mom.w, p_miss - hk * (p_miss - p_hit)))
        dec = mom.d - 1
        ctx = dec * self.y_decode

        def it(n: float) -> float:
            return self.cost.mixed_iteration(n * x_bar, n * pi_bar, n * dec, n * ctx, n)

        a, c_turn = _affine(it, 1e4)
        return a, c_turn

    def nu_cap(self, h: float) -> float:
        """Largest sustainable turn rate at hit probability h (Lemma 5; mixed: r_it > 0)."""
        if self.batching == "separate":
            return 1.0 / (self.t_bar(h) + (self.mom.d - 1) * self._decode_slope())
        return 1.0 / self._mixed_parts(h)[1]

    def decode_running(self, nu: float, h: float) -> float:
        """R_D: decoding requests at turn rate nu (separate server), root of R(1-p) = nu(d-1) tau_D(R)."""
        d1 = self.mom.d - 1
        p = nu * self.t_bar(h)
        if nu <= 0.0:
            return 0.0
        if p >= 1.0:
            return math.inf
        y = self.y_decode

        def g(R: float) -> float:
            return R * (1.0 - p) - nu * d1 * self.cost.decode_time(R, y)

        hi = max(1.0, nu * d1 * self.cost.decode_time(0.0, y) / (1.0 - p))
        while g(hi) < 0.0:
            hi *= 2.0
            if hi > 1e12:
                return math.inf
        from scipy.optimize import brentq  # deferred (analysis/theory/model_f.py)

        return float(brentq(g, 0.0, hi, xtol=1e-12, rtol=1e-13))

    def decode_time_per_turn(self, nu: float, h: float) -> float:
        """S_D: time a turn spends decoding its d - 1 remaining tokens."""
        d1 = self.mom.d - 1
        if self.batching == "separate":
            if nu <= 0.0:
                return d1 * self.cost.decode_time(0.0, self.y_decode)
            R = self.decode_running(nu, h)
            return R / nu if math.isfinite(R) else math.inf
        a, c_turn = self._mixed_parts(h)
        r_it = (1.0 - nu * c_turn) / a
        return d1 / r_it if r_it > 0.0 else math.inf

    def service(self, nu: float, h: float) -> FloatArray:
        """S_k = t_k(h) + S_D: how long turn k occupies the engine (and reserves E_k)."""
        return self.t_turn(h) + self.decode_time_per_turn(nu, h)

    def k_run(self, nu: float, h: float) -> float:
        """K_run(nu, h) = nu sum_k w_k E_k S_k: KV reserved by running requests."""
        S = self.service(nu, h)
        if not np.all(np.isfinite(S)):
            return math.inf
        return nu * float(np.dot(self.mom.w * self.mom.E, S))

    def nu_for_pool(self, M: float, h: float, extra_per_nu: float = 0.0) -> float:
        """Turn rate nu that fills M with running reservations plus nu * extra_per_nu of idle KV."""
        cap = self.nu_cap(h)

        def g(nu: float) -> float:
            k = self.k_run(nu, h)
            return (k if math.isfinite(k) else 1e300) + nu * extra_per_nu - M

        hi = cap * (1.0 - 1e-12)
        if g(hi) <= 0.0:  # pragma: no cover - K_run diverges at the cap (Lemma 5)
            return hi
        from scipy.optimize import brentq  # deferred (analysis/theory/model_f.py)

        return float(brentq(g, 0.0, hi, xtol=1e-14, rtol=1e-13))


# ---------------------------------------------------------------------------------------------
# all-miss onset (Proposition 3)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Onset:
    """The all-miss state of a cell: nu_b, mu_b (the model's lambda_miss), E_S and n_b."""

    nu_b: float
    mu_b: float
    E_S: float
    S_bar: float
    tool_term: float  # nu_b * zbar'
    pool_term: float  # M / E_S
    M: float

    @property
    def n_b(self) -> float:
        return self.tool_term + self.pool_term


def all_miss_onset(server: Server, M: float) -> Onset:
    """nu_b solves K_run(nu, 0) = M; n_b = nu_b zbar' + M / E_S (Proposition 3(b))."""
    mom = server.mom
    nu_b = server.nu_for_pool(M, 0.0)
    S = server.service(nu_b, 0.0)
    S_bar = float(np.dot(mom.w, S))
    E_S = float(np.dot(mom.w * mom.E, S)) / S_bar
    return Onset(
        nu_b=nu_b,
        mu_b=nu_b / mom.mean_T,
        E_S=E_S,
        S_bar=S_bar,
        tool_term=nu_b * mom.tool_per_turn,
        pool_term=M / E_S,
        M=float(M),
    )


def onset_speed_law(onset_1: Onset, speed: float, tool_per_turn: float) -> float:
    """n_b(s) = n_b(1) + (s - 1) nu_b(1) zbar' (Proposition 3(c)), for a uniform GPU speed-up s."""
    return onset_1.n_b + (speed - 1.0) * onset_1.nu_b * tool_per_turn


# ---------------------------------------------------------------------------------------------
# the curve (Assumption MF, no-slack closure S5)
# ---------------------------------------------------------------------------------------------
def idle_kv_per_session_rate(mom: WorkloadMoments, R: float) -> float:
    """D(R) = A1 E[min(Z, R)] + E[E_T] R for exponential tool times (Che's characteristic time).

    By H = lambda G, sessions completing at rate mu leave mu * D(R) tokens of idle KV: the KV held
    through tool calls shorter than R, and every session's final KV until it ages out at R.
    """
    zbar = mom.tool_mean
    return mom.A1 * zbar * (-math.expm1(-R / zbar)) + mom.mean_ET * R


@dataclass(frozen=True)
class CurvePoint:
    R: float  # characteristic idle age (s); 0 on the all-miss branch
    h: float  # follow-up hit probability
    nu: float  # turns/s
    mu: float  # sessions/s
    n: float  # closed population
    queue: float  # sessions waiting for admission (all-miss branch only)


def queue_free_state(server: Server, M: float, R: float) -> CurvePoint:
    """The unique queue-free stationary state with characteristic time R > 0 (Proposition 3(a))."""
    mom = server.mom
    h = -math.expm1(-R / mom.tool_mean)
    D = idle_kv_per_session_rate(mom, R)
    nu = server.nu_for_pool(M, h, extra_per_nu=D / mom.mean_T)
    S_bar = float(np.dot(mom.w, server.service(nu, h)))
    n = nu * (S_bar + mom.tool_per_turn)
    return CurvePoint(R=R, h=h, nu=nu, mu=nu / mom.mean_T, n=n, queue=0.0)


@dataclass(frozen=True)
class Curve:
    """The predicted closed-population curve: queue-free branch (by R) and the all-miss branch."""

    server: Server
    M: float
    branch: tuple[CurvePoint, ...]  # queue-free states, R decreasing (towards the onset)
    onset: Onset

    def arrays(self) -> dict[str, np.ndarray]:
        return {f: np.array([getattr(p, f) for p in self.branch]) for f in ("R", "h", "nu", "mu", "n")}

    @property
    def folds(self) -> bool:
        """True if n(R) is not monotone, i.e. the queue-free branch folds back."""
        n = self.arrays()["n"]
        return bool(np.any(np.diff(n) < -1e-9))

    def _interp(self, n: float, field_: str) -> float | None:
        a = self.arrays()
        idx = np.nonzero(a["n"] >= n)[0]  # first state along the good branch reaching n
        if idx.size == 0:
            return None
        i = int(idx[0])
        if i == 0:
            return float(a[field_][0] * (n / a["n"][0] if field_ == "mu" else 1.0))
        x0, x1 = a["n"][i - 1], a["n"][i]
        t = (n - x0) / (x1 - x0) if x1 > x0 else 0.0
        return float(a[field_][i - 1] + t * (a[field_][i] - a[field_][i - 1]))

    def mu_at(self, n: float) -> float:
        """mu(n): the queue-free branch where it reaches n (the good state where the branch folds),
        else the all-miss rate mu_b (n >= n_b, Proposition 3)."""
        v = self._interp(n, "mu")
        return self.onset.mu_b if v is None else v

    def hit_at(self, n: float) -> float:
        v = self._interp(n, "h")
        return 0.0 if v is None else v

    def crossing(self, level: float = 0.5) -> float:
        """Population at which the follow-up hit probability is `level` (the 0.5-hit crossing).

        Along the queue-free branch h = F_Z(R), so it is the state with R = F_Z^{-1}(level).
        """
        R = -self.server.mom.tool_mean * math.log1p(-level)
        return queue_free_state(self.server, self.M, R).n

    @property
    def peak(self) -> CurvePoint:
        """The highest-throughput state on the grid, refined by a bounded search in log R."""
        a = self.arrays()
        i = int(np.argmax(a["mu"]))
        lo = math.log(a["R"][min(i + 1, a["R"].size - 1)])
        hi = math.log(a["R"][max(i - 1, 0)])
        from scipy.optimize import minimize_scalar

        res = minimize_scalar(
            lambda y: -queue_free_state(self.server, self.M, math.exp(y)).mu,
            bounds=(min(lo, hi), max(lo, hi)),
            method="bounded",
            options={"xatol": 1e-6},
        )
        return queue_free_state(self.server, self.M, math.exp(res.x))


def predicted_curve(server: Server, M: float, n_points: int = 200) -> Curve:
    """The curve mu(n) from first principles: a grid in R from deep hits down to the onset."""
    mom = server.mom
    onset = all_miss_onset(server, M)
    # R from 1e4 tool means (n ~ 0, h ~ 1) down to 1e-4 tool means (h ~ 0, n ~ n_b), log-spaced
    Rs = mom.tool_mean * np.logspace(4, -4, n_points)
    branch = tuple(queue_free_state(server, M, float(R)) for R in Rs)
    return Curve(server=server, M=float(M), branch=branch, onset=onset)


def mu_of_n(curve: Curve, ns: np.ndarray) -> np.ndarray:
    return np.array([curve.mu_at(float(n)) for n in ns])


# ---------------------------------------------------------------------------------------------
# heuristic layers that the text defines precisely enough
# ---------------------------------------------------------------------------------------------
def critical_fresh_burst(mom: WorkloadMoments, n1: float, n2: float, E_S: float) -> float:
    """H3's deterministic core: the fresh burst that carries the population across the basin.

    Under Eq. (2) a burst of sessions with the stationary turn mix must add n2 - n1 sessions.
    Fresh sessions are small at first, so H3 counts a burst by its peak footprint per session,
    max_k G_k E_k (a cohort advancing in step), against the KV that n2 - n1 stationary running
    sessions occupy, (n2 - n1) E_S. This is our reading of the brief definition in App. E.9;
    the probability layer of H3 (per-seed stuck probability) is not defined there.
    """
    return (n2 - n1) * E_S / float(np.max(mom.footprint_by_turn))


def demand_averaged_mu(curve: Curve, mom: WorkloadMoments, n: float, nodes: int = 41) -> float:
    """H1 (our reading): mu(n) averaged over the fluctuation of the KV demand of n sessions.

    The KV demand of n sessions fluctuates around n E_bar with variance n Var(E) under the turn
    mix; we map a demand D to the equivalent population D / E_bar, average mu over that normal
    law (Gauss-Hermite), and clip populations at 0. The paper says only that H1 averages the curve
    over the demand fluctuation; the normal law and the population mapping are our choices.
    """
    var_E = float(np.dot(mom.w, (mom.E - mom.E_bar) ** 2))
    sd_n = math.sqrt(max(n, 0.0) * var_E) / mom.E_bar
    if sd_n == 0.0:
        return curve.mu_at(n)
    x, wts = np.polynomial.hermite_e.hermegauss(nodes)
    vals = np.array([curve.mu_at(max(n + sd_n * xi, 0.0)) for xi in x])
    return float(np.dot(wts, vals) / wts.sum())
