"""Window statistics of the calibration stages (paper App. E.3): μ(n), hit fraction, all-miss rates.

One definition serves simulated and real runs (both read as turn and session tables):
- μ(n), sessions-based: sessions completed inside the window per second;
- μ(n), turns-based: turns completed inside the window per second, divided by E[T]. Session work is
  heavy-tailed in T, so this has much lower variance than the session count;
- hit fraction: share of the window's completed turns with more than half their prompt cached;
- uncached prefill token rate: prompt tokens not served from cache, per second, attributed to
  each turn's prefill end. With the cache off (E0a) it is the all-miss token rate.
The hit and token-rate estimators are analysis.metrics' own, so the all-miss reference measured
here and the rate the E2 rule compares with it are the same estimator.
E0a's λ_ref is the mean over seeds of the turns-based rate; its standard error is over seeds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from analysis.metrics import (
    hit_fraction,
    interval_bin_means,
    ls_slope,
    present_sessions,
    system_intervals,
    uncached_token_rate,
)
from harness.recording.schema import HIT_THRESHOLD


@dataclass(frozen=True)
class WindowStats:
    n: int
    seed: int
    start: float
    end: float
    sessions_completed: int
    turns_completed: int
    mu_sessions: float  # sessions/s
    mu_turns: float  # turns/s / E[T], sessions/s
    hit_fraction: float
    token_hit_fraction: float  # cached / prompt tokens over the window's turns
    uncached_token_rate: float  # tokens/s
    prompt_token_rate: float  # tokens/s

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def window_stats(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    start: float,
    end: float,
    expected_turns: float,
    *,
    n: int = 0,
    seed: int = 0,
) -> WindowStats:
    """Statistics over [start, end) by completion time. Turns need done_time, status,
    prompt_tokens, cached_tokens; sessions need end and outcome."""
    span = end - start
    if span <= 0:
        raise ValueError(f"empty window [{start}, {end})")
    t = turns[(turns["status"] == "ok") & (turns["done_time"] >= start) & (turns["done_time"] < end)]
    s = sessions[(sessions["outcome"] == "completed") & (sessions["end"] >= start) & (sessions["end"] < end)]
    prompt = t["prompt_tokens"].astype(float)
    cached = t["cached_tokens"].fillna(0).astype(float)
    nt = len(t)
    ptok = float(prompt.sum())
    return WindowStats(
        n=n,
        seed=seed,
        start=start,
        end=end,
        sessions_completed=len(s),
        turns_completed=nt,
        mu_sessions=len(s) / span,
        mu_turns=nt / span / expected_turns,
        hit_fraction=hit_fraction(turns, start, end, HIT_THRESHOLD),
        token_hit_fraction=float(cached.sum()) / ptok if ptok else math.nan,
        uncached_token_rate=uncached_token_rate(turns, start, end),
        prompt_token_rate=ptok / span,
    )


def curve_table(stats: Sequence[WindowStats]) -> pd.DataFrame:
    """Stage C as a table, one row per (n, seed), sorted by n."""
    return pd.DataFrame([s.as_dict() for s in stats]).sort_values(["n", "seed"]).reset_index(drop=True)


def curve_means(stats: Sequence[WindowStats]) -> pd.DataFrame:
    """Per-n means over seeds (with the standard error of μ when there are several seeds)."""
    df = curve_table(stats)
    g = df.groupby("n")
    out = g[["mu_sessions", "mu_turns", "hit_fraction", "uncached_token_rate"]].mean()
    out["mu_sessions_se"] = g["mu_sessions"].sem()
    out["seeds"] = g.size()
    return out.reset_index()


def hit_crossing(ns: Sequence[float], hits: Sequence[float], level: float = 0.5) -> float:
    """First n at which the hit fraction falls through `level`, by linear interpolation (NaN if none)."""
    pts = sorted(zip(ns, hits))
    for (n0, h0), (n1, h1) in itertools.pairwise(pts):
        if h0 >= level > h1:
            return n0 + (h0 - level) * (n1 - n0) / (h0 - h1)
    return math.nan


@dataclass(frozen=True)
class E0aSummary:
    lambda_ref: float  # turns-based all-miss session rate, mean over seeds
    lambda_ref_se: float
    lambda_sessions: float  # completed-sessions estimate, mean over seeds
    lambda_sessions_se: float
    all_miss_token_rate: float  # uncached prefill tokens/s, mean over seeds
    all_miss_token_rate_se: float
    seeds: int
    check: WindowStats | None  # the saturation check (more sessions, same rates expected)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["check"] = None if self.check is None else self.check.as_dict()
        return d


def _mean_se(x: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        return math.nan, math.nan
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan
    return float(a.mean()), se


def e0a_summary(per_seed: Sequence[WindowStats], check: WindowStats | None = None) -> E0aSummary:
    lt, lt_se = _mean_se([s.mu_turns for s in per_seed])
    ls, ls_se = _mean_se([s.mu_sessions for s in per_seed])
    tr, tr_se = _mean_se([s.uncached_token_rate for s in per_seed])
    return E0aSummary(lt, lt_se, ls, ls_se, tr, tr_se, len(per_seed), check)


# ---------------------------------------------------------------------------------------------
# E0b: from-empty stability
# ---------------------------------------------------------------------------------------------
E0B_FINAL_MAX = 50.0  # stable needs the final backlog below this (registered, App. E.3)
E0B_RISE_MAX = 10.0  # ... and the fitted rise over the last span at most this
E0B_RISE_SPAN = 1500.0  # seconds at the end of the run the rise is fitted over
E0B_BIN = 10.0


@dataclass(frozen=True)
class E0bStats:
    """One from-empty run. The queue is the sessions in the system (arrived, not ended: waiting,
    running or in a tool call; Decision 12), in exact 10 s bin means; final = the last bin's mean;
    rise = the least-squares slope over the last `rise_span` seconds' bins x rise_span."""

    multiple: float
    seed: int
    duration: float
    final_backlog: float
    rise: float
    stable: bool
    sessions: int  # sessions that arrived in the run
    realized_multiple: float  # sessions / duration / lambda_ref
    hit_fraction: float  # over the rise span
    max_backlog: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def e0b_stats(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    *,
    multiple: float,
    seed: int,
    lambda_ref: float,
    duration: float,
    rise_span: float = E0B_RISE_SPAN,
    bin_s: float = E0B_BIN,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
) -> E0bStats:
    if rise_span > duration or rise_span < 2 * bin_s:
        raise ValueError(f"rise_span {rise_span} s must lie within the run ({duration} s) and cover two {bin_s} s bins")
    n_bins = round(duration / bin_s)
    edges = np.linspace(0.0, n_bins * bin_s, n_bins + 1)
    n_sys = interval_bin_means(*system_intervals(sessions), edges)
    centers = 0.5 * (edges[:-1] + edges[1:])
    start = duration - rise_span
    sel = centers >= start
    rise = ls_slope(centers[sel], n_sys[sel]) * rise_span
    final = float(n_sys[-1])
    arrived = len(present_sessions(sessions))
    return E0bStats(
        multiple=float(multiple),
        seed=int(seed),
        duration=float(duration),
        final_backlog=final,
        rise=float(rise),
        stable=bool(final < final_max and rise <= rise_max),
        sessions=int(arrived),
        realized_multiple=arrived / duration / lambda_ref,
        hit_fraction=hit_fraction(turns, start, duration, HIT_THRESHOLD),
        max_backlog=float(np.max(n_sys)) if n_sys.size else 0.0,
    )
