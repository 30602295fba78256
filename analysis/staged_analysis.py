"""Run directories -> a rule's verdict: the one judging path, for every family (E2 included).

For each run: read the record, compute the window statistics every family shares
(analysis.metrics.run_statistics over the protocol's window, with the spec's bins, span and hit
threshold), the spec's own measures (analysis.measures), the arm's perturbation and the protocol as
`arm.*` / `protocol.*`, the facts that decide whether a run counts (`run.completed`, `run.plan_ok`,
`run.cell_ok`, `run.bound`), and the frozen predictions for that run (`pred.*`, from a prediction
file, never computed here). Then the staged engine judges runs, seeds, groups and the test; the
paired test's verdict is laid out as E2's always was (analysis/paired.py). Every bin and span comes
from the spec or the run's protocol: nothing here has a value of its own.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.analyzed import StagedAnalyzedRun
from analysis.family_metrics import completions
from analysis.forking import forked_map
from analysis.measures import RunTables, measure_all
from analysis.metrics import (
    MetricSpec,
    bin_edges,
    interval_bin_means,
    kept_tables,
    paused_intervals,
    run_series,
    run_statistics,
)
from analysis.openloop import run_open_loop
from analysis.paired import is_paired, ordered_arms, paired_verdict
from analysis.predictions import Predictions
from analysis.stages import COUNTED, judge_staged, judge_staged_run
from harness.recording.record import RunData, RunFormatError, load_run
from harness.recording.schema import RunStatus

NAN = float("nan")
# The tables of a run record that judging it reads (the gauges are the engine's, never read here).
SCORED_TABLES = ("turns", "sessions", "gate_events")


def flatten(prefix: str, obj: Any, out: dict[str, Any]) -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'prefix.a.b': 1}; None leaves are dropped (they read as NaN)."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if k == "description":
                continue
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif obj is not None and not isinstance(obj, (list, tuple)):
        out[prefix] = obj
    return out


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def run_refs(meta: Mapping[str, Any], override: Mapping[str, float] | None) -> dict[str, float]:
    """The references every rule reads: lam (nominal), lam_miss (= the cell's lambda_ref), the E0a
    all-miss token rate, the rate multiple and lambda_ref."""
    refs = dict(meta.get("references") or {})
    if override:
        refs.update(override)
    lam_ref = float(refs["lambda_ref"])
    rate = float(meta["rate"])
    amr = refs.get("all_miss_token_rate")
    return {
        "lam": rate * lam_ref,
        "lam_miss": lam_ref,
        "all_miss_rate": float(amr) if amr is not None else NAN,
        "rate": rate,
        "lambda_ref": lam_ref,
    }


def speed_pin_quantities(meta: Mapping[str, Any]) -> dict[str, float]:
    """`pin_start` and `pin_after` (analysis/quantities.py SPEED_PIN) from a run's meta.json: the
    pin's probe over its target before the run and in the after-run recheck; NaN when absent."""
    pin = meta.get("engine_speed_pin") or {}
    raw = pin.get("after")
    after: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    def ratio(v: Any) -> float:
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else NAN

    return {
        "pin_start": ratio(pin.get("ratio")) if pin.get("pinned") else NAN,
        "pin_after": ratio(after.get("ratio")),
    }


def run_quantities(
    run_dir: Path | str,
    spec: Mapping[str, Any],
    *,
    refs_override: Mapping[str, float] | None = None,
    predictions: Predictions | None = None,
    expect_cell: str | None = None,
    expect_registration: Mapping[str, Any] | None = None,
    series: bool = True,
) -> StagedAnalyzedRun:
    """One run directory judged by a staged spec (stage 1); MISSING when it cannot be read."""
    try:
        run = load_run(run_dir, tables=SCORED_TABLES)
    except (RunFormatError, OSError) as exc:
        name = Path(run_dir).name
        return StagedAnalyzedRun(
            judge_staged_run(spec, name, NAN, -1, None, reason=str(exc), run_dir=str(run_dir)), None, None
        )
    meta = run.meta
    p = meta["protocol"]
    params = spec["params"]
    mspec = MetricSpec(
        window_start=float(p["window"]["start"]),
        window_end=float(p["window"]["end"]),
        duration=float(p["duration"]),
        backlog_bin=float(params["backlog_bin"]),
        recovered_span=float(params["recovered_span"]),
        hit_threshold=float(params["hit_threshold"]),
        outstanding_stat=str(params["outstanding_stat"]),
    )
    refs = run_refs(meta, refs_override)
    stats = run_statistics(run.turns, run.sessions, run.gate_events, mspec)
    stats["token_ratio"] = stats["token_rate"] / refs["all_miss_rate"] if refs["all_miss_rate"] > 0 else NAN
    stats["slope_threshold"] = float(params["slope_factor"]) * (refs["lam"] - refs["lam_miss"])
    stats["completions_ref"] = stats["sessions_completed_rate"] / refs["lambda_ref"]
    stats["base_arrivals_ref"] = stats["base_arrival_rate_window"] / refs["lambda_ref"]
    stats["duration"] = mspec.duration
    stats["wall_s"] = meta.get("wall_s")
    q: dict[str, Any] = {**refs, **stats}
    flatten("arm", meta.get("arm_config") or {}, q)
    flatten("protocol", {k: v for k, v in p.items() if k != "name"}, q)
    q["cap"] = meta.get("cap")
    q.update(speed_pin_quantities(meta))
    plan_sha = (meta.get("plan") or {}).get("sha256")
    file_sha = _sha(Path(run_dir) / str((meta.get("plan") or {}).get("file") or "plan.parquet"))
    cell = (meta.get("cell") or {}).get("name")
    reg = meta.get("registration")
    q.update(
        {
            "run.completed": meta.get("status") == RunStatus.COMPLETED and not run.partial,
            "run.plan_ok": plan_sha is not None and plan_sha == file_sha,
            "run.cell_ok": expect_cell is None or cell == expect_cell,
            "run.bound": _bound(reg, expect_registration),
            "run.cell": cell or "",
        }
    )
    # Roles and predictions name arms by the arm's own name (the paper's), whatever file the test
    # listed it under; the test's key is kept beside it.
    arm = str((meta.get("arm_config") or {}).get("name") or meta["arm"])
    q["arm_key"] = str(meta["arm"])
    notes = []
    if predictions is not None:
        pv, note = predictions.for_run(arm, float(meta["rate"]), int(meta["seed"]), plan_sha)
        q.update(pv)
        if note:
            notes.append(note)
    tables = RunTables(
        run.turns,
        run.sessions,
        run.gate_events,
        mspec.duration,
        refs["lambda_ref"],
        mspec.hit_threshold,
        mspec.backlog_bin,
    )
    q.update(measure_all(spec.get("measures"), tables, {**params, **q}))
    status = COUNTED if run.status == RunStatus.COMPLETED else run.status
    if run.partial and status == COUNTED:
        status = "PARTIAL"
    reason = "; ".join([*(x for x in [meta.get("status_reason")] if x), *notes])
    sr = judge_staged_run(
        spec, arm, float(meta["rate"]), int(meta["seed"]), q, status=status, reason=reason, run_dir=str(run_dir)
    )
    ser = figure_series(run, mspec, params, refs["lambda_ref"], Path(run_dir)) if series else None
    return StagedAnalyzedRun(sr, ser, meta, run_open_loop(meta, run.sessions))


def figure_series(
    run: RunData, mspec: MetricSpec, params: Mapping[str, Any], lambda_ref: float, run_dir: Path
) -> dict[str, np.ndarray]:
    """What the reports draw of one run: hit fractions per the protocol's `hit_bin`, backlogs per the
    rule's `backlog_bin` (outstanding with rescue pauses too), and, for a rule that names its
    `completions_bin` (MIRROR), completions per bin in lambda_ref."""
    try:
        hit_bin = float(run.meta["protocol"]["hit_bin"])
    except KeyError:
        raise RunFormatError(
            f"{run_dir}/meta.json: protocol.hit_bin: missing; expected the protocol's hit bin (s)"
        ) from None
    ser = run_series(
        run.turns, run.sessions, run.gate_events, mspec.duration, hit_bin, mspec.backlog_bin, mspec.hit_threshold
    )
    # outstanding_bins(..., paused=True): run_series's outstanding (in flight + held) plus the
    # rescue pauses, the same sum without computing its first two terms again
    be = bin_edges(0.0, mspec.duration, mspec.backlog_bin)
    ser["outstanding_paused"] = ser["outstanding"] + interval_bin_means(*paused_intervals(run.gate_events), be)
    if "completions_bin" in params:
        edges = np.arange(0.0, mspec.duration + 1e-9, float(params["completions_bin"]))
        ser["completions_t"] = edges[:-1]
        ser["completions"] = (
            np.array([completions(run.sessions, a, b) for a, b in itertools.pairwise(edges)]) / lambda_ref
        )
    return ser


def _bound(reg: Any, expect: Mapping[str, Any] | None) -> bool:
    """Bound to the registration the test names: its SHA-256 matches (a test with no
    registration binds runs that name none)."""
    if expect is None:
        return not reg
    return isinstance(reg, Mapping) and reg.get("sha256") == expect.get("sha256")


def analyze_staged(
    run_dirs: Sequence[Path | str],
    spec: Mapping[str, Any],
    *,
    arms: Sequence[str] | None,
    rates: Sequence[float] | None,
    seeds: Sequence[int] | None,
    refs_override: Mapping[str, float] | None = None,
    predictions: Predictions | None = None,
    test_name: str | None = None,
    expect_cell: str | None = None,
    expect_registration: Mapping[str, Any] | None = None,
    workers: int = 1,
) -> tuple[dict[str, Any], list[StagedAnalyzedRun]]:
    """The verdict over `run_dirs`; arms, rates and seeds default to those the runs name (pass the
    registered ones, so a missing run counts as missing). The paired test's verdict has E2's layout.

    `workers` > 1 scores the runs in that many processes (analysis.forking.forked_map: forks of
    this one, where that is safe); each run's quantities are the same either way."""

    def score(d: Path | str) -> StagedAnalyzedRun:
        with kept_tables():  # a run's tables are only read while it is scored (analysis.metrics)
            return run_quantities(
                d,
                spec,
                refs_override=refs_override,
                predictions=predictions,
                expect_cell=expect_cell,
                expect_registration=expect_registration,
            )

    analyzed = forked_map(score, run_dirs, workers)
    runs = [a.run for a in analyzed]
    present = [r for r in runs if r.status != "MISSING"]
    if not arms:
        named = {r.arm for r in present}
        arms = ordered_arms(named, spec) if is_paired(spec) else sorted(named)
    arms = list(arms)
    rates = list(rates) if rates else sorted({r.rate for r in present if not math.isnan(r.rate)})
    seeds = list(seeds) if seeds else sorted({r.seed for r in present if r.seed >= 0})
    out = judge_staged(spec, runs, rates=rates, seeds=seeds, arms=arms)
    metas = [a.meta for a in analyzed if a.meta]
    ref_block = next((m.get("references") for m in metas if m.get("references")), None)
    verdict = {
        "test": test_name or next((m.get("test") for m in metas), None),
        **out,
        "arms": arms,
        "registered_rates": rates,
        "seeds": seeds,
        "references": {**(ref_block or {}), **(refs_override or {})},
        "predictions": predictions.describe() if predictions is not None else None,
        "rule_spec": dict(spec),
        "runs": [r.to_json() for r in runs],
    }
    if is_paired(spec):
        entries = [(Path(a.run.run_dir).name, a.run.arm, a.run.rate, a.run.seed, a.open_loop) for a in analyzed]
        verdict = paired_verdict(spec, verdict, runs, entries)
    return verdict, analyzed
