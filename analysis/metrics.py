"""Per-run series and window statistics, computed from a run's turn, session and gate rows.

Everything is rebuilt from the client's own records, never from engine gauges, so a simulated run
and a real one are measured by the same code, and a run that ended early (or a partial record) is
measured the same way as a complete one.

Definitions (the registered E2 rule reads them; see analysis/rules.py):
- hit: a turn with cached/prompt > the rule's `hit_threshold`, attributed to its completion time. The hit
  fraction counts every completed turn; the follow-up hit fraction only turns after the first.
- uncached prefill token rate: sum of (prompt - cached) over completed turns, attributed to the
  time of the first output token (when prefill ends), divided by the window length.
- sessions in the system at t: arrived (not refused) and not ended, whether held at the gate,
  paused, waiting for the engine or asleep in a tool call.
- outstanding at t: requests in flight (sent, no response yet) + sessions held at the gate
  (+ sessions paused by a rescue gate, where a rule asks for it).
- bin means are exact time averages of these step functions over each bin, not samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis.arrays import FloatArray
from analysis.quantities import WINDOW_STATISTICS as WINDOW_STATISTICS  # re-exported: run_statistics's keys
from harness.errors import RuleError

NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# step functions
# ---------------------------------------------------------------------------------------------
def _cum_integral(points: FloatArray, x: FloatArray) -> FloatArray:
    """sum_i max(0, x - p_i) for every x, with `points` sorted."""
    k = np.searchsorted(points, x, side="right")
    csum = np.concatenate(([0.0], np.cumsum(points)))
    return k * x - csum[k]


def interval_bin_means(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> FloatArray:
    """Time average per bin of the number of intervals [start, end) covering t.

    An end of NaN or +inf means "still open"; a NaN start means the interval never began.
    """
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    ok = ~np.isnan(s)
    s, e = s[ok], e[ok]
    e = np.where(np.isnan(e), np.inf, e)
    e = np.maximum(e, s)
    x = np.asarray(edges, dtype=float)
    up = np.sort(s)
    down = np.sort(e[np.isfinite(e)])
    f = _cum_integral(up, x) - _cum_integral(down, x)
    return np.diff(f) / np.diff(x)


def interval_count_at(starts: np.ndarray, ends: np.ndarray, t: float) -> int:
    """Number of intervals [start, end) covering t (open ends count)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    e = np.where(np.isnan(e), np.inf, e)
    return int(np.sum((s <= t) & (e > t)))


def ls_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Ordinary least-squares slope of y on x (NaN with fewer than two points)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size < 2:
        return NAN
    xc = x - x.mean()
    den = float(np.dot(xc, xc))
    return float(np.dot(xc, y - y.mean()) / den) if den > 0 else NAN


# ---------------------------------------------------------------------------------------------
# interval sets from the records
# ---------------------------------------------------------------------------------------------
def column(df: pd.DataFrame, name: str, default: float = NAN) -> FloatArray:
    """A column as floats (NaN for nulls); a table without it reads as `default` throughout."""
    if name in df.columns:
        kept = _KEPT
        if kept is None:
            return df[name].to_numpy(dtype=float, na_value=NAN)
        key = (id(df), name, "", True)
        got = kept.get(key)
        if got is None:
            arr = df[name].to_numpy(dtype=float, na_value=NAN)
            arr.flags.writeable = False  # handed out again: a caller that wrote to it would change the next
            kept[key] = got = (df, arr)
        return got[1]
    return np.full(len(df), default)


def present_sessions(sessions: pd.DataFrame) -> pd.DataFrame:
    """Sessions that entered the system (SHED refusals never do)."""
    if sessions.empty:
        return sessions
    return _subset(sessions, "outcome", "refused", False)


# While one run is scored (`kept_tables`, around staged_analysis.run_quantities) its tables are
# only read, yet its scoring filters a table to its completed turns (or present sessions) a dozen
# times and reads the same columns as floats again and again; on Arrow-backed frames each filter
# copies every column (a quarter of `analyze`) and each read converts the column. Inside the scope
# a filter or a column read is kept and handed out again, keyed by the frame's id; the frame is
# kept with it, so no other frame can take that id before the scope ends, and the arrays handed
# out are read-only. Outside a scope (a caller that changes a frame between calls) nothing is kept.
# tests/unit/analysis/test_metrics_subsets.py checks the kept forms against the direct ones.
_KEPT: dict[tuple[int, str, str, bool], tuple[pd.DataFrame, Any]] | None = None


@contextmanager
def kept_tables() -> Iterator[None]:
    """Keep filters and column reads of the frames read inside (which must not change meanwhile)."""
    global _KEPT
    outer = _KEPT
    if outer is None:
        _KEPT = {}
    try:
        yield
    finally:
        if outer is None:
            _KEPT = None


def _subset(df: pd.DataFrame, col: str, value: str, equal: bool) -> pd.DataFrame:
    """`df[df[col] == value]` (equal) or `df[df[col] != value]`, kept inside `kept_tables`."""
    kept = _KEPT
    key = (id(df), col, value, equal)
    got = None if kept is None else kept.get(key)
    if got is None:
        sub = df[df[col] == value] if equal else df[df[col] != value]
        if kept is None:
            return sub
        kept[key] = got = (df, sub)
    return got[1]


def system_intervals(sessions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    s = present_sessions(sessions)
    return column(s, "arrival"), column(s, "end")


def gated_intervals(sessions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Held at the gate: from the moment the client saw the arrival (planned arrival + start
    lateness, which a wall-clock client may add without any gate) to admission (never admitted =
    held to the end)."""
    s = present_sessions(sessions)
    arr = column(s, "arrival") + np.nan_to_num(column(s, "start_lateness", 0.0))
    adm = column(s, "admission")
    end = column(s, "end")
    # A session that ended without admission cannot exist; guard anyway by closing at its end.
    adm = np.where(np.isnan(adm), end, adm)
    return arr, adm


def inflight_intervals(turns: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Requests in flight: from send to response (open requests stay in flight to the end)."""
    return column(turns, "send_time"), column(turns, "done_time")


def paused_intervals(gate_events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rescue pauses, matched per session in time order (an unmatched pause lasts to the end)."""
    if gate_events is None or gate_events.empty:
        return np.empty(0), np.empty(0)
    ev = gate_events[gate_events["event"].isin(["pause", "resume"])].sort_values("time", kind="stable")
    open_at: dict[int, float] = {}
    starts: list[float] = []
    ends: list[float] = []
    for t, kind, sid in zip(ev["time"].to_numpy(float), ev["event"], ev["session"].to_numpy(dtype=float, na_value=-1)):
        if kind == "pause":
            open_at[int(sid)] = float(t)
        elif int(sid) in open_at:
            starts.append(open_at.pop(int(sid)))
            ends.append(float(t))
    for t in open_at.values():
        starts.append(t)
        ends.append(NAN)
    return np.asarray(starts), np.asarray(ends)


# ---------------------------------------------------------------------------------------------
# turn statistics
# ---------------------------------------------------------------------------------------------
def completed_turns(turns: pd.DataFrame) -> pd.DataFrame:
    if turns.empty:
        return turns
    return _subset(turns, "status", "ok", True)


def turn_hits(turns: pd.DataFrame, threshold: float) -> npt.NDArray[np.bool_]:
    prompt = column(turns, "prompt_tokens")
    cached = column(turns, "cached_tokens")
    with np.errstate(invalid="ignore", divide="ignore"):
        return cached / prompt > threshold


def hit_fraction(turns: pd.DataFrame, start: float, end: float, threshold: float, followup: bool = False) -> float:
    """Share of completed turns in [start, end) that hit; NaN if none completed."""
    t = completed_turns(turns)
    if t.empty:
        return NAN
    done = column(t, "done_time")
    m = (done >= start) & (done < end)
    if followup:
        m &= column(t, "turn") > 1
    n = int(m.sum())
    return float(turn_hits(t, threshold)[m].sum() / n) if n else NAN


def hit_bin_counts(
    turns: pd.DataFrame, edges: np.ndarray, threshold: float, followup: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(completed turns, hits) per bin of `edges`, by the turns' done time: the two counts a bin's hit
    fraction is made of (sim2real/parity.py also needs the denominators, for a bin's sampling noise)."""
    t = completed_turns(turns)
    if t.empty:
        zero = np.zeros(len(edges) - 1)
        return zero, zero.copy()
    done = column(t, "done_time")
    hits = turn_hits(t, threshold).astype(float)
    keep = np.ones(len(t), bool) if not followup else column(t, "turn") > 1
    n, _ = np.histogram(done[keep], bins=edges)
    h, _ = np.histogram(done[keep], bins=edges, weights=hits[keep])
    return n.astype(float), h


def hit_fraction_from_counts(n: np.ndarray, h: np.ndarray) -> np.ndarray:
    """A bin's hit fraction, NaN where it holds no turn."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = np.where(n > 0, h / np.maximum(n, 1), NAN)
    return out


def hit_fraction_bins(turns: pd.DataFrame, edges: np.ndarray, threshold: float, followup: bool = False) -> np.ndarray:
    return hit_fraction_from_counts(*hit_bin_counts(turns, edges, threshold, followup))


def uncached_tokens(turns: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(time of prefill end, uncached prompt tokens) per completed turn."""
    t = completed_turns(turns)
    ft = column(t, "first_token_time")
    at = np.where(np.isnan(ft), column(t, "done_time"), ft)
    return at, np.maximum(column(t, "prompt_tokens") - column(t, "cached_tokens"), 0.0)


def uncached_token_rate(turns: pd.DataFrame, start: float, end: float) -> float:
    at, tok = uncached_tokens(turns)
    m = (at >= start) & (at < end)
    return float(tok[m].sum() / (end - start))


# ---------------------------------------------------------------------------------------------
# the per-run summary the rules read
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """Measurement settings; the registered values come from the rule spec and the protocol."""

    window_start: float
    window_end: float
    duration: float
    backlog_bin: float
    recovered_span: float
    hit_threshold: float
    outstanding_stat: str  # how the last span's outstanding backlog is summarised: mean | max | end


def bin_edges(start: float, end: float, width: float) -> np.ndarray:
    n = max(1, math.floor((end - start) / width + 1e-9))
    return start + width * np.arange(n + 1)


def run_statistics(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    gate_events: pd.DataFrame | None,
    spec: MetricSpec,
) -> dict[str, Any]:
    """The window statistics of one run: the inputs of every E2 condition, plus descriptive extras."""
    w0, w1 = spec.window_start, spec.window_end
    edges = bin_edges(w0, w1, spec.backlog_bin)
    sys_s, sys_e = system_intervals(sessions)
    n_sys = interval_bin_means(sys_s, sys_e, edges)
    centers = 0.5 * (edges[:-1] + edges[1:])

    last0 = spec.duration - spec.recovered_span
    last_edges = bin_edges(last0, spec.duration, spec.backlog_bin)
    outst = outstanding_bins(turns, sessions, gate_events, last_edges)
    outst_end = outstanding_at(turns, sessions, gate_events, spec.duration - 1e-9)
    if spec.outstanding_stat == "mean":
        o_last = float(np.mean(outst))
    elif spec.outstanding_stat == "max":
        o_last = float(np.max(outst))
    elif spec.outstanding_stat == "end":
        o_last = float(outst_end)
    else:
        raise RuleError(f"params.outstanding_stat: got {spec.outstanding_stat!r}; expected mean, max or end")

    present = present_sessions(sessions)
    ended = column(present, "end")
    done_ok = present["outcome"].to_numpy() == "completed" if not present.empty else np.zeros(0, bool)
    in_w = (ended >= w0) & (ended < w1)
    arr = column(present, "arrival")
    base = present["kind"].to_numpy() == "base" if not present.empty else np.zeros(0, bool)
    arrived_w = int(np.sum(base & (arr >= w0) & (arr < w1)))
    refused = int((sessions["outcome"] == "refused").sum()) if not sessions.empty else 0
    ct = completed_turns(turns)
    tdone = column(ct, "done_time")
    g_s, g_e = gated_intervals(sessions)
    waited = (g_e - g_s) > 1e-9
    failed_turns = int((turns["status"].isin(["error", "timeout"])).sum()) if not turns.empty else 0

    return {
        "window_start": w0,
        "window_end": w1,
        "window_len": w1 - w0,
        "hit": hit_fraction(turns, w0, w1, spec.hit_threshold),
        "followup_hit": hit_fraction(turns, w0, w1, spec.hit_threshold, followup=True),
        "token_rate": uncached_token_rate(turns, w0, w1),
        "backlog_mean": float(np.mean(n_sys)),
        "backlog_end": float(interval_count_at(sys_s, sys_e, spec.duration - 1e-9)),
        "slope": ls_slope(centers, n_sys),
        "hit_last": hit_fraction(turns, last0, spec.duration, spec.hit_threshold),
        "outstanding_last": o_last,
        "outstanding_end": float(outst_end),
        "sessions_completed_rate": float(np.sum(in_w & done_ok) / (w1 - w0)),
        "turns_completed_rate": float(np.sum((tdone >= w0) & (tdone < w1)) / (w1 - w0)),
        "base_arrivals_window": arrived_w,
        "base_arrival_rate_window": arrived_w / (w1 - w0),
        "sessions": len(present),
        "refused": refused,
        "failed_sessions": int(np.sum(present["outcome"].to_numpy() == "failed")) if not present.empty else 0,
        "failed_turns": failed_turns,
        "gate_waited": int(np.sum(waited)),
        "gate_mean_wait": float(np.mean((g_e - g_s)[waited])) if np.any(waited) else 0.0,
        "gate_last_held": float(np.nanmax(g_e[waited])) if np.any(waited) else NAN,
    }


# The keys of run_statistics, in its order (tests/unit/analysis/test_rules_e2.py checks they agree),
# are analysis.quantities.WINDOW_STATISTICS (re-exported above).


def outstanding_bins(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    gate_events: pd.DataFrame | None,
    edges: np.ndarray,
    paused: bool = False,
) -> FloatArray:
    out = interval_bin_means(*inflight_intervals(turns), edges) + interval_bin_means(*gated_intervals(sessions), edges)
    if paused and gate_events is not None:
        out = out + interval_bin_means(*paused_intervals(gate_events), edges)
    return out


def outstanding_at(
    turns: pd.DataFrame, sessions: pd.DataFrame, gate_events: pd.DataFrame | None, t: float, paused: bool = False
) -> int:
    n = interval_count_at(*inflight_intervals(turns), t) + interval_count_at(*gated_intervals(sessions), t)
    if paused and gate_events is not None:
        n += interval_count_at(*paused_intervals(gate_events), t)
    return n


def run_series(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    gate_events: pd.DataFrame | None,
    duration: float,
    hit_bin: float,
    backlog_bin: float,
    threshold: float,
) -> dict[str, np.ndarray]:
    """Time series for figures: hit fractions per `hit_bin`, backlogs per `backlog_bin`."""
    he = bin_edges(0.0, duration, hit_bin)
    be = bin_edges(0.0, duration, backlog_bin)
    return {
        "hit_t": he[:-1],
        "hit": hit_fraction_bins(turns, he, threshold),
        "followup_hit": hit_fraction_bins(turns, he, threshold, followup=True),
        "backlog_t": 0.5 * (be[:-1] + be[1:]),
        "in_system": interval_bin_means(*system_intervals(sessions), be),
        "outstanding": outstanding_bins(turns, sessions, gate_events, be),
    }
