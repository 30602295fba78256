"""Workload moments that every theory layer shares (paper §3 and App. E.9, "Model").

Model F needs the survival function G_k = P(T >= k); the entry model needs the turn mix and the KV
that sessions carry through tool calls. Computing them once, from the workload config alone, keeps
the two layers on exactly the same inputs: the same turn law, the same prompt growth
L_k = L0 + (k-1)(Delta + d) that the client sends, the same tool-time mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.arrays import FloatArray
from harness.config import WorkloadConfig


def survival(mean: float, cap: int) -> FloatArray:
    """G_k = P(T >= k), k = 1..cap, for T = min(Geometric(1/mean) on {1, 2, ...}, cap).

    Returned as an array indexed from 0 (entry 0 is G_1 = 1); its length is the cap, so the last
    index K satisfies G_K > 0, as model F requires.
    """
    if mean <= 1.0:
        raise ValueError(f"turn mean must exceed 1, got {mean}")
    if cap < 1:
        raise ValueError(f"turn cap must be >= 1, got {cap}")
    q = 1.0 - 1.0 / mean
    return q ** np.arange(cap, dtype=float)


@dataclass(frozen=True)
class WorkloadMoments:
    """Turn law and KV moments of one workload. Arrays are indexed k-1 (k = 1..K).

    G        P(T >= k)
    pmf      P(T = k)
    L        prompt length of turn k (tokens), L_k
    E        KV of a session after turn k, E_k = L_k + d
    w        stationary turn mix w_k = G_k / E[T]
    mean_T   E[T]
    mean_W   all-miss prefill tokens per session, sum_k G_k L_k
    E_bar    mean KV of a turn under the turn mix, sum_k w_k E_k
    A1       KV a session carries into tool calls over its life, sum_k P(T >= k+1) E_k
    mean_ET  final KV of a session, E[E_T]
    hit_ceiling  largest possible follow-up-inclusive turn hit fraction, 1 - 1/E[T] (turn 1 misses)
    tool_mean    mean tool time zbar (s)
    tool_per_turn  zbar' = zbar (1 - 1/E[T]), tool time per turn
    d, delta, L0   decode tokens per turn, tool tokens per follow-up, first prompt
    """

    G: FloatArray
    pmf: FloatArray
    L: FloatArray
    E: FloatArray
    w: FloatArray
    mean_T: float
    mean_W: float
    E_bar: float
    A1: float
    mean_ET: float
    hit_ceiling: float
    tool_mean: float
    tool_per_turn: float
    d: int
    delta: int
    L0: int

    @property
    def K(self) -> int:
        return int(self.G.size)

    @property
    def k(self) -> np.ndarray:
        """Turn indices 1..K."""
        return np.arange(1, self.K + 1)

    @property
    def r(self) -> FloatArray:
        """Continuation probabilities r_k = G_{k+1}/G_k (r_K = 0)."""
        nxt = np.append(self.G[1:], 0.0)
        return nxt / self.G

    @property
    def mean_prompt(self) -> float:
        """Mean prompt of a turn under the stationary mix, sum_k w_k L_k."""
        return float(np.dot(self.w, self.L))

    @property
    def footprint_by_turn(self) -> FloatArray:
        """Expected KV of a fresh session after its k-th turn, G_k E_k.

        A cohort of fresh sessions that advance in step holds this much per session at turn k;
        its maximum is the per-session peak footprint by which a burst counts (heuristic H3).
        """
        return self.G * self.E

    @property
    def E_lb(self) -> float:
        """Length-biased mean KV with every turn weighted equally, the last included (E.4)."""
        return self.E_bar


def moments_from_law(
    G: FloatArray, *, first_prompt: int, tool_tokens: int, decode_tokens: int, tool_mean: float
) -> WorkloadMoments:
    """Moments for any turn law given by its survival function (G_1 = 1, non-increasing, G_K > 0)."""
    G = np.asarray(G, dtype=float)
    if G.ndim != 1 or G.size < 1 or abs(G[0] - 1.0) > 1e-12:
        raise ValueError("G must be a 1-d survival function with G_1 = 1")
    if np.any(np.diff(G) > 1e-15) or G[-1] <= 0.0:
        raise ValueError("G must be non-increasing with G_K > 0")
    K = G.size
    k = np.arange(1, K + 1)
    L = first_prompt + (k - 1) * (tool_tokens + decode_tokens)
    E = L + decode_tokens
    G_next = np.append(G[1:], 0.0)
    pmf = G - G_next
    mean_T = float(G.sum())
    w = G / mean_T
    return WorkloadMoments(
        G=G,
        pmf=pmf,
        L=L.astype(float),
        E=E.astype(float),
        w=w,
        mean_T=mean_T,
        mean_W=float(np.dot(G, L)),
        E_bar=float(np.dot(w, E)),
        A1=float(np.dot(G_next, E)),
        mean_ET=float(np.dot(pmf, E)),
        hit_ceiling=1.0 - 1.0 / mean_T,
        tool_mean=float(tool_mean),
        tool_per_turn=float(tool_mean) * (1.0 - 1.0 / mean_T),
        d=int(decode_tokens),
        delta=int(tool_tokens),
        L0=int(first_prompt),
    )


def workload_moments(workload: WorkloadConfig) -> WorkloadMoments:
    """Moments of a workload config (capped geometric turns, exponential tool times)."""
    G = survival(workload.turns.mean, workload.turns.cap)
    return moments_from_law(
        G,
        first_prompt=workload.first_prompt,
        tool_tokens=workload.tool_tokens,
        decode_tokens=workload.decode_tokens,
        tool_mean=workload.tool_time.mean,
    )
