"""The quantities of the registered tests beyond E2's window statistics (BASIN, TOOLSLOW, SHED,
rescue, CUT, MIRROR, S1-S5, persistence, E0b), from a run's turn, session and gate rows.

Like analysis.metrics (whose step functions and interval sets they use), they read only the
client's own records. Every width, span and threshold is an argument: a rule spec names each one
(analysis/measures.py passes them), so nothing here carries a registered value of its own.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from analysis.metrics import (
    NAN,
    bin_edges,
    column,
    completed_turns,
    hit_fraction,
    interval_bin_means,
    interval_count_at,
    ls_slope,
    present_sessions,
    system_intervals,
    turn_hits,
)


def completions(sessions: pd.DataFrame, start: float, end: float) -> float:
    """Sessions whose last turn ended in [start, end), per second (failed sessions do not count)."""
    s = present_sessions(sessions)
    if s.empty:
        return 0.0
    e = column(s, "end")
    ok = s["outcome"].to_numpy() == "completed"
    return float(np.sum(ok & (e >= start) & (e < end)) / (end - start))


def wave_time(sessions: pd.DataFrame, kind: str) -> tuple[float, int, int]:
    """(median completion time, completed, total) of the sessions of `kind` (the MIRROR wave).

    Unfinished sessions count as completing after the run, so the median is NaN unless more than
    half of the cohort finished."""
    s = present_sessions(sessions)
    s = s[s["kind"] == kind] if not s.empty else s
    n = len(s)
    if n == 0:
        return NAN, 0, 0
    e = column(s, "end")
    done = s["outcome"].to_numpy() == "completed"
    t = np.where(done, e, np.inf)
    med = float(np.median(t))
    return (med if math.isfinite(med) else NAN), int(done.sum()), n


def mean_prompt(turns: pd.DataFrame, start: float, end: float) -> float:
    """Mean prompt length of the turns completed in [start, end) (model F's served mix)."""
    t = completed_turns(turns)
    if t.empty:
        return NAN
    done = column(t, "done_time")
    m = (done >= start) & (done < end)
    p = column(t, "prompt_tokens")[m]
    return float(np.nanmean(p)) if p.size else NAN


def turn_gaps(turns: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(completion time, gap) per follow-up turn: the time since the same session's previous turn
    completed. A turn whose predecessor did not complete has no gap."""
    t = completed_turns(turns)
    if t.empty:
        return np.empty(0), np.empty(0)
    df = pd.DataFrame({"s": column(t, "session"), "k": column(t, "turn"), "d": column(t, "done_time")}).sort_values(
        ["s", "k"], kind="stable"
    )
    s, k, d = df["s"].to_numpy(), df["k"].to_numpy(), df["d"].to_numpy()
    prev_ok = np.concatenate(([False], (s[1:] == s[:-1]) & (k[1:] == k[:-1] + 1)))
    gap = np.where(prev_ok, d - np.concatenate(([NAN], d[:-1])), NAN)
    keep = ~np.isnan(gap)
    return d[keep], gap[keep]


def gap_trend(turns: pd.DataFrame, start: float, end: float, width: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Least-squares slope of the per-`width` medians of the gap (by completion time) over
    [start, end), with the bin centres and medians (S2's estimator)."""
    d, g = turn_gaps(turns)
    edges = bin_edges(start, end, width)
    centers, meds = [], []
    for lo, hi in itertools.pairwise(edges):
        m = (d >= lo) & (d < hi)
        if m.any():
            centers.append(0.5 * (lo + hi))
            meds.append(float(np.median(g[m])))
    c, y = np.asarray(centers), np.asarray(meds)
    return ls_slope(c, y), c, y


def plan_arrival_rate(sessions: pd.DataFrame, start: float, end: float, kind: str) -> float:
    """Realized arrivals of the plan's `kind` sessions in [start, end), per second, refused included
    (what the frozen plan delivered, whatever the gate or SHED did with them)."""
    if sessions.empty:
        return 0.0
    arr = column(sessions, "arrival")
    m = (arr >= start) & (arr < end)
    if kind != "all":
        m &= sessions["kind"].to_numpy() == kind
    return float(np.sum(m) / (end - start))


def in_system_at(sessions: pd.DataFrame, t: float) -> int:
    """Sessions in the system at t (arrived, not refused, not ended)."""
    return interval_count_at(*system_intervals(sessions), t)


def backlog_slope(sessions: pd.DataFrame, start: float, end: float, width: float) -> float:
    """Least-squares slope of the `width` bin means of sessions in the system over [start, end)."""
    edges = bin_edges(start, end, width)
    n = interval_bin_means(*system_intervals(sessions), edges)
    return ls_slope(0.5 * (edges[:-1] + edges[1:]), n)


def backlog_mean(sessions: pd.DataFrame, start: float, end: float) -> float:
    return float(interval_bin_means(*system_intervals(sessions), np.array([start, end]))[0])


def tiles(start: float, end: float, width: float) -> list[tuple[float, float]]:
    """[start, end) tiled by `width` from its start; a short remainder is covered by the window that
    ends at `end` (the rescue POSTGOOD tiling)."""
    if end - start < width - 1e-9:
        return [(start, end)] if end > start else []
    out = []
    a = start
    while a + width <= end + 1e-9:
        out.append((a, a + width))
        a += width
    if out and out[-1][1] < end - 1e-9:
        out.append((end - width, end))
    return out


def tiled_followup(turns: pd.DataFrame, start: float, end: float, width: float, threshold: float) -> dict[str, float]:
    """Follow-up hit fraction per tile of [start, end): the lowest tile, how many tiles had no
    completed follow-up turn, and the whole interval."""
    vals = [hit_fraction(turns, a, b, threshold, followup=True) for a, b in tiles(start, end, width)]
    finite = [v for v in vals if not math.isnan(v)]
    return {
        "min": min(finite) if finite else NAN,
        "n": float(len(vals)),
        "empty": float(sum(1 for v in vals if math.isnan(v))),
        "whole": hit_fraction(turns, start, end, threshold, followup=True) if end > start else NAN,
    }


def rolling_followup(
    turns: pd.DataFrame,
    start: float,
    end: float,
    width: float,
    step: float,
    threshold: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Follow-up hit fraction in windows [a, a + width) for a = start, start + step, ... with
    a + width <= end (attributed by completion time): the persistence windows."""
    t = completed_turns(turns)
    n_w = math.floor((end - start - width) / step + 1e-9) + 1
    if n_w <= 0:
        return np.empty(0), np.empty(0)
    a = start + step * np.arange(n_w)
    if t.empty:
        return a, np.full(n_w, NAN)
    done = column(t, "done_time")
    keep = column(t, "turn") > 1
    hits = turn_hits(t, threshold)[keep]
    done = done[keep]
    order = np.argsort(done, kind="stable")
    done, hits = done[order], hits[order].astype(float)
    csum = np.concatenate(([0.0], np.cumsum(hits)))
    lo = np.searchsorted(done, a, side="left")
    hi = np.searchsorted(done, a + width, side="left")
    n = hi - lo
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(n > 0, (csum[hi] - csum[lo]) / np.maximum(n, 1), NAN)
    return a, v


def persistence(
    turns: pd.DataFrame,
    trigger_end: float,
    stop: float,
    *,
    width: float,
    step: float,
    onset_max: float,
    escape_min: float,
    threshold: float,
) -> dict[str, float]:
    """Trap onset and escape in rolling windows (App. D, D5).

    Onset: the first window starting at or after `trigger_end` whose follow-up hit fraction is at
    most `onset_max`. Escape: a later window at least `escape_min`, counted only if it ends by
    `stop` (the run's end or the start of an intervention). Trapped time runs from the onset
    window's start (and, the other reading, from its end) to `stop` or the escape."""
    a, v = rolling_followup(turns, 0.0, stop, width, step, threshold)
    out = {
        "onset": NAN,
        "escape": NAN,
        "max_after": NAN,
        "trapped_s": 0.0,
        "trapped_s_late": 0.0,
        "windows": float(a.size),
    }
    idx = np.nonzero((a >= trigger_end - 1e-9) & (v <= onset_max))[0]
    if idx.size == 0:
        return out
    i0 = int(idx[0])
    onset = float(a[i0])
    out["onset"] = onset
    after = v[i0 + 1 :]
    fin = after[~np.isnan(after)]
    out["max_after"] = float(fin.max()) if fin.size else NAN
    esc = np.nonzero(after >= escape_min)[0]
    end = float(stop)
    if esc.size:
        out["escape"] = float(a[i0 + 1 + int(esc[0])])
        end = out["escape"]
    out["trapped_s"] = max(0.0, end - onset)
    out["trapped_s_late"] = max(0.0, end - onset - width)
    return out


def trigger_sessions(sessions: pd.DataFrame, gate_events: pd.DataFrame | None, kind: str) -> np.ndarray:
    """Session ids of the trigger: burst sessions ('burst'), sessions with a slowed tool call
    ('slowed', from the client's `slow` events), or both ('auto')."""
    ids: set[int] = set()
    if kind in ("burst", "auto") and not sessions.empty:
        ids |= {int(x) for x in sessions.loc[sessions["kind"] == "burst", "session"]}
    if kind in ("slowed", "auto") and gate_events is not None and not gate_events.empty:
        ev = gate_events[gate_events["event"] == "slow"]
        ids |= {int(x) for x in ev["session"].dropna()}
    return np.asarray(sorted(ids), dtype=np.int64)


def trigger_outlived(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    gate_events: pd.DataFrame | None,
    duration: float,
    kind: str,
    threshold: float,
) -> dict[str, float]:
    """When the last trigger session left, and the turns and hits completed after that (App. D, D1).
    NaN times when some trigger session was still present at the end of the run."""
    ids = trigger_sessions(sessions, gate_events, kind)
    out = {
        "n": float(ids.size),
        "still_present": NAN,
        "last_left": NAN,
        "before_end": NAN,
        "turns_after": NAN,
        "hits_after": NAN,
    }
    if ids.size == 0:
        return out
    s = sessions[sessions["session"].isin(ids)]
    ended = s["outcome"].isin(["completed", "failed"]).to_numpy()
    out["still_present"] = float(np.sum(~ended))
    if not ended.all():
        return out
    last = float(np.nanmax(column(s, "end")))
    out["last_left"] = last
    out["before_end"] = duration - last
    t = completed_turns(turns)
    m = column(t, "done_time") >= last
    out["turns_after"] = float(m.sum())
    out["hits_after"] = float(turn_hits(t, threshold)[m].sum())
    return out


def gate_summary(gate_events: pd.DataFrame | None, sessions: pd.DataFrame, duration: float) -> dict[str, float]:
    """The gate's record: engage and release times, pauses, the largest number held, and the
    client's delay in session-hours (admission waits plus pauses)."""
    out = {
        "engage": NAN,
        "release": NAN,
        "pauses": 0.0,
        "paused_sessions": 0.0,
        "max_held": 0.0,
        "delay_h": 0.0,
        "waited": 0.0,
        "resumes": 0.0,
        "unmatched_pauses": 0.0,
        "refused": 0.0,
        "slowed_calls": 0.0,
        "slowed_sessions": 0.0,
    }
    s = present_sessions(sessions)
    if not s.empty:
        gw = np.nan_to_num(column(s, "gate_wait"), nan=0.0)
        pt = np.nan_to_num(column(s, "paused_time"), nan=0.0)
        out["delay_h"] = float((gw.sum() + pt.sum()) / 3600.0)
        out["waited"] = float(np.sum(gw > 1e-9))
    if not sessions.empty:
        out["refused"] = float((sessions["outcome"] == "refused").sum())
    if gate_events is None or gate_events.empty:
        return out
    ev = gate_events
    kinds = ev["event"].to_numpy()
    times = column(ev, "time")
    if (kinds == "engage").any():
        out["engage"] = float(times[kinds == "engage"].min())
    if (kinds == "release").any():
        out["release"] = float(times[kinds == "release"].min())
    out["pauses"] = float((kinds == "pause").sum())
    out["resumes"] = float((kinds == "resume").sum())
    out["unmatched_pauses"] = out["pauses"] - out["resumes"]
    out["paused_sessions"] = float(ev.loc[kinds == "pause", "session"].nunique())
    out["slowed_calls"] = float((kinds == "slow").sum())
    out["slowed_sessions"] = float(ev.loc[kinds == "slow", "session"].nunique())
    held = np.nan_to_num(column(ev, "queue_new"), nan=0.0) + np.nan_to_num(column(ev, "queue_resume"), nan=0.0)
    out["max_held"] = float(held.max()) if held.size else 0.0
    return out


def e0b_stability(
    sessions: pd.DataFrame, duration: float, final_bin: float, rise_span: float, bin_width: float
) -> dict[str, float]:
    """E0b's queue statistics (sessions in the system): the mean of the last `final_bin` seconds,
    and the least-squares rise over the last `rise_span` seconds (slope of `bin_width` bins x span)."""
    sys_s, sys_e = system_intervals(sessions)
    final = float(interval_bin_means(sys_s, sys_e, np.array([duration - final_bin, duration]))[0])
    edges = bin_edges(duration - rise_span, duration, bin_width)
    n = interval_bin_means(sys_s, sys_e, edges)
    return {"final": final, "rise": ls_slope(0.5 * (edges[:-1] + edges[1:]), n) * rise_span}
