"""Named measurements a rule spec may ask for, and their evaluation on one run.

A staged rule spec lists its `measures` as data, e.g.

    measures:
      pre_hit: {metric: followup_hit, start: "arm.gate.t_on - 300", end: "arm.gate.t_on"}
      post:    {metric: tiled_followup, start: "gate.release + 300", end: duration, width: 300}

Arguments are numbers or expressions over what the run already has (the references, the arm's
perturbation under `arm.`, the base window statistics and earlier measures), so windows that
depend on the run (the rescue's release time) stay data. `kind` and `unit` are literal words.
Every metric is one of analysis.metrics' or analysis.family_metrics' estimators, and a measure
names every argument its metric takes (analysis/rulecheck.py refuses one that does not): a window,
width or threshold has no default here. A metric that returns several values is flattened with
dots (`post.min`, `gate.release`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis import family_metrics as F
from analysis import metrics as M
from analysis.expr import RUN_NAN_PREFIXES, Env, Evaluator, ordered
from analysis.quantities import LITERAL_ARGS, METRIC_ARGS
from harness.errors import RuleError

NAN = float("nan")


@dataclass(frozen=True)
class RunTables:
    """What a measurement reads: the run's tables and the rule's settings that scale them."""

    turns: pd.DataFrame
    sessions: pd.DataFrame
    gate_events: pd.DataFrame | None
    duration: float
    lambda_ref: float
    hit_threshold: float
    backlog_bin: float


@dataclass(frozen=True)
class Metric:
    """One metric a measure may name: the estimator and every argument a spec must give it. No
    argument has a default, so a window, width or threshold a verdict uses is always the spec's."""

    fn: Callable[..., Any]
    args: tuple[str, ...]


def _unit(x: float, t: RunTables, unit: str) -> float:
    if unit == "lambda_ref":
        return x / t.lambda_ref
    if unit == "abs":
        return x
    raise RuleError(f"unit: got {unit!r}; expected 'lambda_ref' or 'abs'")


def _followup(t: RunTables, start: float, end: float) -> float:
    return M.hit_fraction(t.turns, start, end, t.hit_threshold, followup=True)


def _hit(t: RunTables, start: float, end: float) -> float:
    return M.hit_fraction(t.turns, start, end, t.hit_threshold)


def _completions(t: RunTables, start: float, end: float, unit: str) -> float:
    return _unit(F.completions(t.sessions, start, end), t, unit)


def _arrivals(t: RunTables, start: float, end: float, kind: str, unit: str) -> float:
    return _unit(F.plan_arrival_rate(t.sessions, start, end, kind), t, unit)


def _wave(t: RunTables, kind: str) -> dict[str, float]:
    med, done, n = F.wave_time(t.sessions, kind)
    return {"time": med, "done": float(done), "n": float(n)}


def _outstanding_at(t: RunTables, at: float, paused: float) -> float:
    return float(M.outstanding_at(t.turns, t.sessions, t.gate_events, at, bool(paused)))


def _outstanding_mean(t: RunTables, start: float, end: float, paused: float) -> float:
    if not end > start:
        return NAN
    return float(M.outstanding_bins(t.turns, t.sessions, t.gate_events, np.array([start, end]), bool(paused))[0])


def _gap_slope(t: RunTables, start: float, end: float, width: float) -> float:
    return F.gap_trend(t.turns, start, end, width)[0]


def _tiled(t: RunTables, start: float, end: float, width: float) -> dict[str, float]:
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        return {"min": NAN, "n": 0.0, "empty": NAN, "whole": NAN}
    return F.tiled_followup(t.turns, start, end, width, t.hit_threshold)


def _persistence(
    t: RunTables, trigger_end: float, stop: float, width: float, step: float, onset_max: float, escape_min: float
) -> dict[str, float]:
    stop = t.duration if not math.isfinite(stop) else min(stop, t.duration)
    return F.persistence(
        t.turns,
        trigger_end,
        stop,
        width=width,
        step=step,
        onset_max=onset_max,
        escape_min=escape_min,
        threshold=t.hit_threshold,
    )


MEASURES: dict[str, Metric] = {
    "followup_hit": Metric(_followup, ("start", "end")),
    "hit": Metric(_hit, ("start", "end")),
    "completions": Metric(_completions, ("start", "end", "unit")),
    "token_rate": Metric(lambda t, start, end: M.uncached_token_rate(t.turns, start, end), ("start", "end")),
    "backlog_slope": Metric(
        lambda t, start, end, width: F.backlog_slope(t.sessions, start, end, width), ("start", "end", "width")
    ),
    "backlog_mean": Metric(lambda t, start, end: F.backlog_mean(t.sessions, start, end), ("start", "end")),
    "in_system_at": Metric(lambda t, at: float(F.in_system_at(t.sessions, at)), ("at",)),
    "outstanding_at": Metric(_outstanding_at, ("at", "paused")),
    "outstanding_mean": Metric(_outstanding_mean, ("start", "end", "paused")),
    "mean_prompt": Metric(lambda t, start, end: F.mean_prompt(t.turns, start, end), ("start", "end")),
    "gap_slope": Metric(_gap_slope, ("start", "end", "width")),
    "wave": Metric(_wave, ("kind",)),
    "plan_arrival_rate": Metric(_arrivals, ("start", "end", "kind", "unit")),
    "tiled_followup": Metric(_tiled, ("start", "end", "width")),
    "persistence": Metric(_persistence, ("trigger_end", "stop", "width", "step", "onset_max", "escape_min")),
    "trigger": Metric(
        lambda t, kind: F.trigger_outlived(t.turns, t.sessions, t.gate_events, t.duration, kind, t.hit_threshold),
        ("kind",),
    ),
    "gate": Metric(lambda t: F.gate_summary(t.gate_events, t.sessions, t.duration), ()),
    "e0b": Metric(
        lambda t, final_bin, rise_span: F.e0b_stability(t.sessions, t.duration, final_bin, rise_span, t.backlog_bin),
        ("final_bin", "rise_span"),
    ),
}


# Every metric's arguments are analysis.quantities.METRIC_ARGS' (what a spec is checked against).
assert {k: m.args for k, m in MEASURES.items()} == METRIC_ARGS, "MEASURES and METRIC_ARGS name other arguments"


def measure_all(spec_measures: Any, tables: RunTables, env: Mapping[str, Any]) -> dict[str, Any]:
    """Evaluate a spec's measures in order; each sees the earlier ones. Returns flat quantities."""
    out: dict[str, Any] = {}
    scope = Env(env, {}, nan_prefixes=RUN_NAN_PREFIXES)
    ev = Evaluator(scope)
    for name, m in ordered(spec_measures, "measures"):
        fn = MEASURES[m["metric"]].fn
        kwargs: dict[str, Any] = {}
        for k, v in m.items():
            if k == "metric":
                continue
            if k in LITERAL_ARGS:
                kwargs[k] = v
            elif isinstance(v, str):
                x = ev(v)
                kwargs[k] = float(x) if isinstance(x, (int, float)) else NAN
            else:
                kwargs[k] = float(v)
        arg = "at" if "at" in kwargs else None
        bad = [k for k in ("start", "end", arg) if k and k in kwargs and not math.isfinite(kwargs[k])]
        if bad and m["metric"] not in ("tiled_followup", "persistence"):
            value: Any = NAN
        else:
            value = fn(tables, **kwargs)
        flat = {f"{name}.{k}": v for k, v in value.items()} if isinstance(value, Mapping) else {name: value}
        for k, v in flat.items():
            out[k] = v
            scope.set(k, v)
    return out
