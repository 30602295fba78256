"""Per-run series and window statistics, computed from a run's turn, session and gate rows.

Everything is rebuilt from the client's own records, never from engine gauges, so a simulated run
and a real one are measured by the same code, and a run that ended early (or a partial record) is
measured the same way as a complete one.

Definitions (the registered E2 rule reads them; see analysis/rules.py):
- hit: a turn with cached/prompt > threshold (0.5), attributed to its completion time. The hit
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
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.recording.schema import HIT_THRESHOLD

NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# step functions
# ---------------------------------------------------------------------------------------------
def _cum_integral(points: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum_i max(0, x - p_i) for every x, with `points` sorted."""
    k = np.searchsorted(points, x, side="right")
    csum = np.concatenate(([0.0], np.cumsum(points)))
    return k * x - csum[k]


def interval_bin_means(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
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
def _col(df: pd.DataFrame, name: str, default: float = NAN) -> np.ndarray:
    if name in df.columns:
        return df[name].to_numpy(dtype=float, na_value=NAN)
    return np.full(len(df), default)


def present_sessions(sessions: pd.DataFrame) -> pd.DataFrame:
    """Sessions that entered the system (SHED refusals never do)."""
    if sessions.empty:
        return sessions
    return sessions[sessions["outcome"] != "refused"]


def system_intervals(sessions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    s = present_sessions(sessions)
    return _col(s, "arrival"), _col(s, "end")


def gated_intervals(sessions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Held at the gate: from the moment the client saw the arrival (planned arrival + start
    lateness, which a wall-clock client may add without any gate) to admission (never admitted =
    held to the end)."""
    s = present_sessions(sessions)
    arr = _col(s, "arrival") + np.nan_to_num(_col(s, "start_lateness", 0.0))
    adm = _col(s, "admission")
    end = _col(s, "end")
    # A session that ended without admission cannot exist; guard anyway by closing at its end.
    adm = np.where(np.isnan(adm), end, adm)
    return arr, adm


def inflight_intervals(turns: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Requests in flight: from send to response (open requests stay in flight to the end)."""
    return _col(turns, "send_time"), _col(turns, "done_time")


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
    return turns[turns["status"] == "ok"]


def _hits(turns: pd.DataFrame, threshold: float) -> np.ndarray:
    prompt = _col(turns, "prompt_tokens")
    cached = _col(turns, "cached_tokens")
    with np.errstate(invalid="ignore", divide="ignore"):
        return cached / prompt > threshold


def hit_fraction(
    turns: pd.DataFrame, start: float, end: float, threshold: float = HIT_THRESHOLD, followup: bool = False
) -> float:
    """Share of completed turns in [start, end) that hit; NaN if none completed."""
    t = completed_turns(turns)
    if t.empty:
        return NAN
    done = _col(t, "done_time")
    m = (done >= start) & (done < end)
    if followup:
        m &= _col(t, "turn") > 1
    n = int(m.sum())
    return float(_hits(t, threshold)[m].sum() / n) if n else NAN


def hit_fraction_bins(
    turns: pd.DataFrame, edges: np.ndarray, threshold: float = HIT_THRESHOLD, followup: bool = False
) -> np.ndarray:
    t = completed_turns(turns)
    out = np.full(len(edges) - 1, NAN)
    if t.empty:
        return out
    done = _col(t, "done_time")
    hits = _hits(t, threshold).astype(float)
    keep = np.ones(len(t), bool) if not followup else _col(t, "turn") > 1
    n, _ = np.histogram(done[keep], bins=edges)
    h, _ = np.histogram(done[keep], bins=edges, weights=hits[keep])
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(n > 0, h / np.maximum(n, 1), NAN)
    return out


def uncached_tokens(turns: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(time of prefill end, uncached prompt tokens) per completed turn."""
    t = completed_turns(turns)
    ft = _col(t, "first_token_time")
    at = np.where(np.isnan(ft), _col(t, "done_time"), ft)
    return at, np.maximum(_col(t, "prompt_tokens") - _col(t, "cached_tokens"), 0.0)


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
    backlog_bin: float = 10.0
    recovered_span: float = 300.0
    hit_threshold: float = HIT_THRESHOLD
    outstanding_stat: str = "mean"  # how the last span's outstanding backlog is summarised: mean | max | end
    outstanding_paused: bool = False  # count rescue-paused sessions as outstanding


def _bins(start: float, end: float, width: float) -> np.ndarray:
    n = max(1, int(math.floor((end - start) / width + 1e-9)))
    return start + width * np.arange(n + 1)


def run_statistics(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    gate_events: pd.DataFrame | None,
    spec: MetricSpec,
) -> dict[str, Any]:
    """The window statistics of one run: the inputs of every E2 condition, plus descriptive extras."""
    w0, w1 = spec.window_start, spec.window_end
    edges = _bins(w0, w1, spec.backlog_bin)
    sys_s, sys_e = system_intervals(sessions)
    n_sys = interval_bin_means(sys_s, sys_e, edges)
    centers = 0.5 * (edges[:-1] + edges[1:])

    last0 = spec.duration - spec.recovered_span
    last_edges = _bins(last0, spec.duration, spec.backlog_bin)
    outst = outstanding_bins(turns, sessions, gate_events, last_edges, spec.outstanding_paused)
    outst_end = outstanding_at(turns, sessions, gate_events, spec.duration - 1e-9, spec.outstanding_paused)
    if spec.outstanding_stat == "mean":
        o_last = float(np.mean(outst))
    elif spec.outstanding_stat == "max":
        o_last = float(np.max(outst))
    elif spec.outstanding_stat == "end":
        o_last = float(outst_end)
    else:
        raise ValueError(f"outstanding_stat: got {spec.outstanding_stat!r}; expected mean, max or end")

    present = present_sessions(sessions)
    ended = _col(present, "end")
    done_ok = present["outcome"].to_numpy() == "completed" if not present.empty else np.zeros(0, bool)
    in_w = (ended >= w0) & (ended < w1)
    arr = _col(present, "arrival")
    base = present["kind"].to_numpy() == "base" if not present.empty else np.zeros(0, bool)
    arrived_w = int(np.sum(base & (arr >= w0) & (arr < w1)))
    refused = int((sessions["outcome"] == "refused").sum()) if not sessions.empty else 0
    ct = completed_turns(turns)
    tdone = _col(ct, "done_time")
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


def outstanding_bins(
    turns: pd.DataFrame,
    sessions: pd.DataFrame,
    gate_events: pd.DataFrame | None,
    edges: np.ndarray,
    paused: bool = False,
) -> np.ndarray:
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
    hit_bin: float = 100.0,
    backlog_bin: float = 10.0,
    threshold: float = HIT_THRESHOLD,
) -> dict[str, np.ndarray]:
    """Time series for figures: hit fractions per `hit_bin`, backlogs per `backlog_bin`."""
    he = _bins(0.0, duration, hit_bin)
    be = _bins(0.0, duration, backlog_bin)
    return {
        "hit_t": he[:-1],
        "hit": hit_fraction_bins(turns, he, threshold),
        "followup_hit": hit_fraction_bins(turns, he, threshold, followup=True),
        "backlog_t": 0.5 * (be[:-1] + be[1:]),
        "in_system": interval_bin_means(*system_intervals(sessions), be),
        "outstanding": outstanding_bins(turns, sessions, gate_events, be),
    }


# ---------------------------------------------------------------------------------------------
# quantities of the other registered tests (BASIN, TOOLSLOW, SHED, rescue, CUT, MIRROR, S1-S5)
# ---------------------------------------------------------------------------------------------
def completions(sessions: pd.DataFrame, start: float, end: float) -> float:
    """Sessions whose last turn ended in [start, end), per second (failed sessions do not count)."""
    s = present_sessions(sessions)
    if s.empty:
        return 0.0
    e = _col(s, "end")
    ok = s["outcome"].to_numpy() == "completed"
    return float(np.sum(ok & (e >= start) & (e < end)) / (end - start))


def wave_time(sessions: pd.DataFrame, kind: str = "burst") -> tuple[float, int, int]:
    """(median completion time, completed, total) of the sessions of `kind` (the MIRROR wave).

    Unfinished sessions count as completing after the run, so the median is NaN unless more than
    half of the cohort finished."""
    s = present_sessions(sessions)
    s = s[s["kind"] == kind] if not s.empty else s
    n = len(s)
    if n == 0:
        return NAN, 0, 0
    e = _col(s, "end")
    done = s["outcome"].to_numpy() == "completed"
    t = np.where(done, e, np.inf)
    med = float(np.median(t))
    return (med if math.isfinite(med) else NAN), int(done.sum()), n


def mean_prompt(turns: pd.DataFrame, start: float, end: float) -> float:
    """Mean prompt length of the turns completed in [start, end) (model F's served mix)."""
    t = completed_turns(turns)
    if t.empty:
        return NAN
    done = _col(t, "done_time")
    m = (done >= start) & (done < end)
    p = _col(t, "prompt_tokens")[m]
    return float(np.nanmean(p)) if p.size else NAN


def turn_gaps(turns: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(completion time, gap) per follow-up turn: the time since the same session's previous turn
    completed. A turn whose predecessor did not complete has no gap."""
    t = completed_turns(turns)
    if t.empty:
        return np.empty(0), np.empty(0)
    df = pd.DataFrame({"s": _col(t, "session"), "k": _col(t, "turn"), "d": _col(t, "done_time")}).sort_values(
        ["s", "k"], kind="stable"
    )
    s, k, d = df["s"].to_numpy(), df["k"].to_numpy(), df["d"].to_numpy()
    prev_ok = np.concatenate(([False], (s[1:] == s[:-1]) & (k[1:] == k[:-1] + 1)))
    gap = np.where(prev_ok, d - np.concatenate(([NAN], d[:-1])), NAN)
    keep = ~np.isnan(gap)
    return d[keep], gap[keep]


def gap_trend(
    turns: pd.DataFrame, start: float, end: float, width: float = 300.0
) -> tuple[float, np.ndarray, np.ndarray]:
    """Least-squares slope of the per-`width` medians of the gap (by completion time) over
    [start, end), with the bin centres and medians (S2's estimator)."""
    d, g = turn_gaps(turns)
    edges = _bins(start, end, width)
    centers, meds = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (d >= lo) & (d < hi)
        if m.any():
            centers.append(0.5 * (lo + hi))
            meds.append(float(np.median(g[m])))
    c, y = np.asarray(centers), np.asarray(meds)
    return ls_slope(c, y), c, y


def plan_arrival_rate(sessions: pd.DataFrame, start: float, end: float, kind: str = "base") -> float:
    """Realized arrivals of the plan's `kind` sessions in [start, end), per second, refused included
    (what the frozen plan delivered, whatever the gate or SHED did with them)."""
    if sessions.empty:
        return 0.0
    arr = _col(sessions, "arrival")
    m = (arr >= start) & (arr < end)
    if kind != "all":
        m &= sessions["kind"].to_numpy() == kind
    return float(np.sum(m) / (end - start))


def in_system_at(sessions: pd.DataFrame, t: float) -> int:
    """Sessions in the system at t (arrived, not refused, not ended)."""
    return interval_count_at(*system_intervals(sessions), t)


def backlog_slope(sessions: pd.DataFrame, start: float, end: float, width: float = 10.0) -> float:
    """Least-squares slope of the `width` bin means of sessions in the system over [start, end)."""
    edges = _bins(start, end, width)
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


def tiled_followup(
    turns: pd.DataFrame, start: float, end: float, width: float = 300.0, threshold: float = HIT_THRESHOLD
) -> dict[str, float]:
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
    width: float = 300.0,
    step: float = 10.0,
    threshold: float = HIT_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray]:
    """Follow-up hit fraction in windows [a, a + width) for a = start, start + step, ... with
    a + width <= end (attributed by completion time): the persistence windows."""
    t = completed_turns(turns)
    n_w = int(math.floor((end - start - width) / step + 1e-9)) + 1
    if n_w <= 0:
        return np.empty(0), np.empty(0)
    a = start + step * np.arange(n_w)
    if t.empty:
        return a, np.full(n_w, NAN)
    done = _col(t, "done_time")
    keep = _col(t, "turn") > 1
    hits = _hits(t, threshold)[keep]
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
    width: float = 300.0,
    step: float = 10.0,
    onset_max: float = 0.2,
    escape_min: float = 0.5,
    threshold: float = HIT_THRESHOLD,
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


def trigger_sessions(sessions: pd.DataFrame, gate_events: pd.DataFrame | None, kind: str = "auto") -> np.ndarray:
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
    kind: str = "auto",
    threshold: float = HIT_THRESHOLD,
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
    last = float(np.nanmax(_col(s, "end")))
    out["last_left"] = last
    out["before_end"] = duration - last
    t = completed_turns(turns)
    m = _col(t, "done_time") >= last
    out["turns_after"] = float(m.sum())
    out["hits_after"] = float(_hits(t, threshold)[m].sum())
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
        gw = np.nan_to_num(_col(s, "gate_wait"), nan=0.0)
        pt = np.nan_to_num(_col(s, "paused_time"), nan=0.0)
        out["delay_h"] = float((gw.sum() + pt.sum()) / 3600.0)
        out["waited"] = float(np.sum(gw > 1e-9))
    if not sessions.empty:
        out["refused"] = float((sessions["outcome"] == "refused").sum())
    if gate_events is None or gate_events.empty:
        return out
    ev = gate_events
    kinds = ev["event"].to_numpy()
    times = _col(ev, "time")
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
    held = np.nan_to_num(_col(ev, "queue_new"), nan=0.0) + np.nan_to_num(_col(ev, "queue_resume"), nan=0.0)
    out["max_held"] = float(held.max()) if held.size else 0.0
    return out


def e0b_stability(
    sessions: pd.DataFrame, duration: float, final_bin: float = 10.0, rise_span: float = 1500.0, bin_width: float = 10.0
) -> dict[str, float]:
    """E0b's queue statistics (sessions in the system): the mean of the last `final_bin` seconds,
    and the least-squares rise over the last `rise_span` seconds (slope of 10 s bins x span)."""
    sys_s, sys_e = system_intervals(sessions)
    final = float(interval_bin_means(sys_s, sys_e, np.array([duration - final_bin, duration]))[0])
    edges = _bins(duration - rise_span, duration, bin_width)
    n = interval_bin_means(sys_s, sys_e, edges)
    return {"final": final, "rise": ls_slope(0.5 * (edges[:-1] + edges[1:]), n) * rise_span}
