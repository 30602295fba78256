"""The quasi-static model (paper App. E.4): n' = lambda - mu(n) on a closed-population curve.

Why: the registration places test rates inside the window (mu_inf, min(mu*, lambda_e)) and picks a
session cap from the curve; the cap's rescue condition, n1 < c < n2, and the gate's drain time come
from this one-dimensional fluid. It is deliberately not used for the trap itself (model F is).

mu(n) is extended from measured (or predicted) points piecewise-linearly, with mu(0) = 0 and the
last value held beyond the last point, so Eq. (2) has unique solutions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Unimodality:
    ok: bool
    n_star: float
    mu_star: float
    mu_inf: float
    problems: tuple[str, ...]


@dataclass(frozen=True)
class MuCurve:
    """A piecewise-linear closed-population curve mu(n) through (0, 0) and the given points."""

    n: np.ndarray
    mu: np.ndarray

    @staticmethod
    def from_points(n: Sequence[float], mu: Sequence[float]) -> MuCurve:
        n_a, mu_a = np.asarray(n, float), np.asarray(mu, float)
        if n_a.shape != mu_a.shape or n_a.ndim != 1 or n_a.size < 2:
            raise ValueError("need at least two (n, mu) points of equal length")
        order = np.argsort(n_a)
        n_a, mu_a = n_a[order], mu_a[order]
        if np.any(np.diff(n_a) <= 0) or n_a[0] <= 0 or np.any(mu_a < 0):
            raise ValueError("populations must be distinct and positive, rates non-negative")
        return MuCurve(np.concatenate(([0.0], n_a)), np.concatenate(([0.0], mu_a)))

    def __call__(self, n: float | np.ndarray) -> np.ndarray | float:
        out = np.interp(n, self.n, self.mu, right=self.mu[-1])
        return float(out) if np.ndim(out) == 0 else out

    @property
    def mu_inf(self) -> float:
        """The tail value held beyond the last point (the curve's limit under the extension)."""
        return float(self.mu[-1])

    @property
    def peak(self) -> tuple[float, float]:
        i = int(np.argmax(self.mu))
        return float(self.n[i]), float(self.mu[i])

    def unimodality(self, tol: float = 0.0) -> Unimodality:
        """Check the shape §E.4 assumes: strictly rising to the peak, then non-increasing, and
        strictly decreasing wherever mu > mu_inf. `tol` forgives measurement noise of that size."""
        n_star, mu_star = self.peak
        i = int(np.argmax(self.mu))
        probs = []
        up = np.diff(self.mu[: i + 1])
        if np.any(up <= -tol) or (tol == 0 and np.any(up <= 0)):
            probs.append("not strictly increasing up to the peak")
        down = np.diff(self.mu[i:])
        if np.any(down > tol):
            probs.append("rises again after the peak")
        mu_inf = self.mu_inf
        if np.any((down >= 0) & (self.mu[i:-1] > mu_inf + tol)):
            probs.append("flat after the peak while above mu_inf")
        if not mu_inf < mu_star:
            probs.append("no drop after the peak (mu_inf >= mu*)")
        return Unimodality(ok=not probs, n_star=n_star, mu_star=mu_star, mu_inf=mu_inf, problems=tuple(probs))

    # -- fixed points ------------------------------------------------------------------------
    def n1(self, lam: float) -> float:
        """Stable fixed point below the peak, mu(n1) = lam (nan if lam >= mu*)."""
        i = int(np.argmax(self.mu))
        if not 0 < lam < self.mu[i]:
            return math.nan
        n, mu = self.n[: i + 1], self.mu[: i + 1]
        j = int(np.nonzero(mu >= lam)[0][0])
        return float(np.interp(lam, mu[j - 1 : j + 1], n[j - 1 : j + 1]))

    def n2(self, lam: float) -> float:
        """Unstable fixed point beyond the peak (nan unless mu_inf < lam < mu*).

        Without a monotone tail, the first crossing of lam from above after the peak.
        """
        i = int(np.argmax(self.mu))
        if not self.mu_inf < lam < self.mu[i]:
            return math.nan
        n, mu = self.n[i:], self.mu[i:]
        j = int(np.nonzero(mu <= lam)[0][0])
        return float(np.interp(lam, [mu[j], mu[j - 1]], [n[j], n[j - 1]]))

    # -- window and cap ------------------------------------------------------------------------
    def window(self, lambda_e: float | None = None, mu_inf: float | None = None) -> tuple[float, float]:
        """W = (mu_inf, min(mu*, lambda_e)). mu_inf may be given (e.g. lambda_miss) since the
        measured tail is not read as mu_inf in the paper."""
        lo = self.mu_inf if mu_inf is None else mu_inf
        hi = self.peak[1] if lambda_e is None else min(self.peak[1], lambda_e)
        return lo, hi

    def cap_rescues(self, cap: float, lam: float) -> bool:
        """Corollary 4: a FIFO cap empties its gate iff n1 < cap < n2, i.e. mu(cap) > lam."""
        return bool(self(cap) > lam)

    def gate_drain_time(self, cap: float, lam: float, burst: float, n_before: float | None = None) -> dict[str, float]:
        """Time for the gate to empty after a burst of `burst` sessions behind cap `cap`.

        refined: (n1 + b - c)/(mu(c) - lam), the burst filling the c - n1 free slots at once;
        crude: b/(mu(c) - lam), which the registrations' feasibility check used.
        """
        rate = float(self(cap)) - lam
        if rate <= 0:
            return {"refined": math.inf, "crude": math.inf}
        n1 = self.n1(lam) if n_before is None else n_before
        return {"refined": max(n1 + burst - cap, 0.0) / rate, "crude": burst / rate}

    def stop_drain_time(self, x0: float, target: float) -> float:
        """With arrivals stopped, time for n' = -mu(n) to bring the population from x0 to target."""
        if target >= x0:
            return 0.0
        if target <= 0 or self(target) <= 0:
            return math.inf
        grid = np.unique(np.concatenate(([target, x0], self.n[(self.n > target) & (self.n < x0)])))
        # exact integral of 1/mu over each linear piece
        tot = 0.0
        for a, b in itertools.pairwise(grid):
            ma, mb = float(self(a)), float(self(b))
            tot += (b - a) / ma if abs(mb - ma) < 1e-15 else (b - a) * math.log(mb / ma) / (mb - ma)
        return tot

    def min_rescuing_stop(self, x0: float, lam: float) -> float:
        """Shortest arrival stop after which, at rate lam, Eq. (2) returns to n1: reach n2(lam)."""
        n2 = self.n2(lam)
        if math.isnan(n2):
            return math.inf if lam >= self.peak[1] else 0.0
        return self.stop_drain_time(x0, n2)

    def integrate(
        self, n0: float, lam: Callable[[float], float], t_end: float, dt: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Eq. (2) with a time-varying arrival rate (RK4 on a fixed step; the curve is Lipschitz)."""
        steps = max(math.ceil(t_end / dt), 1)
        dt = t_end / steps
        t = np.linspace(0.0, t_end, steps + 1)
        n = np.empty(steps + 1)
        n[0] = n0

        def f(tt: float, x: float) -> float:
            return lam(tt) - float(self(max(x, 0.0)))

        for i in range(steps):
            x, tt = n[i], t[i]
            k1 = f(tt, x)
            k2 = f(tt + dt / 2, x + dt * k1 / 2)
            k3 = f(tt + dt / 2, x + dt * k2 / 2)
            k4 = f(tt + dt, x + dt * k3)
            n[i + 1] = max(x + dt * (k1 + 2 * k2 + 2 * k3 + k4) / 6, 0.0)
        return t, n
