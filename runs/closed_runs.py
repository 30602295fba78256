"""Closed populations on an engine: Stage C (the closed curve mu(n)) and E0a (all-miss capacity).

The procedure (paper App. E.3): a closed population of n sessions starts at t = 0, a finished session
is replaced at once, and statistics are taken over a window after a warm-up (900 s + 1800 s).
Stage C runs the cell as configured for each n; E0a runs it with the prefix cache disabled at 32
sessions for seeds 0-2, plus a 64-session check that the engine is saturated (the token rate
should not move). On a real engine every run gets a fresh server (runs/realrun.py); with `resume`,
a run directory that already holds a COMPLETED run of the same population, seed, times, cell and
workload is summarised instead of run again (`completed_run`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.calibration import (
    E0aSummary,
    WindowStats,
    e0a_summary,
    window_stats,
)
from harness.client.closed import ClosedClient
from harness.config import (
    CellConfig,
    WorkloadConfig,
)
from harness.drivers.virtual import SimResult, simulate
from harness.errors import EngineError
from harness.recording.record import RunRecorder, load_run
from harness.recording.schema import RunStatus
from harness.refengine.model import EngineModel
from harness.workload.draws import expected_turns
from provenance.meta import capture
from runs.calibration_runs import (
    check_run_dirs,
    closed_planned,
    closed_want,
    completed_run,
    e0a_calls,
    stage_c_calls,
)
from runs.realrun import run_real

STAGE_C_NS = (16, 20, 24, 28, 32, 36, 48, 96, 300)
WARMUP = 900.0
WINDOW = 1800.0
E0A_SEEDS = (0, 1, 2)
E0A_N = 32
E0A_CHECK_N = 64


class RunEndedError(EngineError):
    """A real calibration run ended without completing (its engine did not start, failed a check,
    died or was stopped): the stage cannot be summarised. The message is the run's one-line reason
    and where its records are; the stage stops there, since its later runs would meet the same."""


@dataclass(frozen=True)
class ClosedRun:
    stats: WindowStats
    sim: SimResult | None  # the simulator's result; None for a real engine's run or one read back from its record


def run_closed(
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    *,
    seed: int = 0,
    warmup: float = WARMUP,
    window: float = WINDOW,
    run_dir: Path | str | None = None,
    meta: dict[str, Any] | None = None,
    gauge_interval: float = 5.0,
    engine: Any = None,
    resume: bool = False,
) -> ClosedRun:
    """One closed-population run of warmup + window seconds, and its window statistics.

    `engine` None runs the engine model in virtual time; an EngineOptions (runs.realrun) runs
    the same client against a real server, which needs `run_dir` for its log and records. With
    `resume`, a matching COMPLETED run already in `run_dir` is summarised instead (stats only).
    """
    end = warmup + window
    want = closed_want(engine, n, seed, warmup, window)
    if resume and run_dir is not None and completed_run(run_dir, cell, workload, want):
        data = load_run(run_dir)
        return ClosedRun(
            window_stats(data.turns, data.sessions, warmup, end, expected_turns(workload), n=n, seed=seed), None
        )
    if engine is not None:
        return _run_closed_real(
            cell,
            workload,
            n,
            seed=seed,
            end=end,
            warmup=warmup,
            run_dir=run_dir,
            meta=meta,
            gauge_interval=gauge_interval,
            options=engine,
        )
    engine = EngineModel(cell, seed=seed)
    if run_dir is None:
        client = ClosedClient(workload, n, seed=seed)
        res = simulate(client, engine, until=end, gauge_interval=None)
        turns = pd.DataFrame(client.sink.turns)
        sessions = pd.DataFrame(client.sink.sessions)
    else:
        rec = RunRecorder(run_dir, closed_meta("sim", cell, workload, n, seed, warmup, window, meta))
        try:
            client = ClosedClient(workload, n, seed=seed, sink=rec)
            res = simulate(client, engine, recorder=rec, until=end, gauge_interval=gauge_interval)
            rec.update_meta({"simulation": res.as_meta()})
        except BaseException:
            rec.close(RunStatus.FAILED, "simulation raised")
            raise
        rec.close(RunStatus.COMPLETED)
        data = load_run(run_dir)
        turns, sessions = data.turns, data.sessions
    stats = window_stats(turns, sessions, warmup, end, expected_turns(workload), n=n, seed=seed)
    return ClosedRun(stats, res)


def closed_meta(
    engine_kind: str,
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    seed: int,
    warmup: float,
    window: float,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """meta.json of one closed-population run, simulated or real (GPU facts only for a real one)."""
    return {
        "run_kind": "closed",
        "engine_kind": engine_kind,
        "provenance": capture(include_gpu=engine_kind != "sim"),
        "cell": cell,
        "workload": workload,
        "population": n,
        "seed": seed,
        "warmup": warmup,
        "window": window,
        **(extra or {}),
    }


def _run_closed_real(
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    *,
    seed: int,
    end: float,
    warmup: float,
    run_dir: Path | str | None,
    meta: dict[str, Any] | None,
    gauge_interval: float,
    options: Any,
) -> ClosedRun:
    if run_dir is None:
        raise ValueError("a real-engine calibration run needs a run directory (--out)")
    rec = RunRecorder(run_dir, closed_meta(options.engine, cell, workload, n, seed, warmup, end - warmup, meta))
    try:
        client = ClosedClient(workload, n, seed=seed, sink=rec)
        result = run_real(
            client,
            cell=cell,
            options=options,
            run_dir=run_dir,
            recorder=rec,
            duration=end,
            gauge_interval=gauge_interval,
        )
    except BaseException:
        rec.close(RunStatus.FAILED, "calibration run raised")
        raise
    rec.close()
    if result.status != RunStatus.COMPLETED:
        raise RunEndedError(
            f"closed run n={n} seed={seed} ended {result.status}: {result.reason} (records in {run_dir})"
        )
    data = load_run(run_dir)
    stats = window_stats(data.turns, data.sessions, warmup, end, expected_turns(workload), n=n, seed=seed)
    return ClosedRun(stats, None)


def stage_c(
    cell: CellConfig,
    workload: WorkloadConfig,
    ns: Sequence[int] = STAGE_C_NS,
    *,
    seeds: Sequence[int] = (0,),
    out_dir: Path | str | None = None,
    warmup: float = WARMUP,
    window: float = WINDOW,
    engine: Any = None,
    mapper: Mapper | None = None,
    resume: bool = False,
) -> list[WindowStats]:
    """μ(n) and hit fraction for each population n (and seed). `mapper` runs the runs elsewhere
    (e.g. slurm.sweep.SlurmSweep: one job array); the default runs them here, in order. A taken
    run directory is refused before the first run (runs/calibration_runs.py)."""
    calls = stage_c_calls(cell, workload, ns, seeds, out_dir, warmup, window, engine, resume)
    check_run_dirs(closed_planned(calls), resume)
    return list((mapper or serial)(closed_stats, calls))


Mapper = Callable[[Callable[..., Any], Sequence[tuple[Any, ...]]], Sequence[Any]]


def serial(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The default mapper: each call here, in order."""
    return [fn(*c) for c in calls]


def closed_stats(
    cell: CellConfig,
    workload: WorkloadConfig,
    n: int,
    seed: int,
    warmup: float,
    window: float,
    run_dir: str | None,
    meta: dict[str, Any],
    engine: Any,
    resume: bool = False,
) -> WindowStats:
    """One closed run's window statistics (a module-level function, so a job array can run it)."""
    return run_closed(
        cell,
        workload,
        n,
        seed=seed,
        warmup=warmup,
        window=window,
        run_dir=run_dir,
        meta=meta,
        engine=engine,
        resume=resume,
    ).stats


def cache_off(cell: CellConfig) -> CellConfig:
    return cell.model_copy(update={"prefix_cache": False})


def e0a(
    cell: CellConfig,
    workload: WorkloadConfig,
    *,
    seeds: Sequence[int] = E0A_SEEDS,
    n: int = E0A_N,
    check_n: int | None = E0A_CHECK_N,
    out_dir: Path | str | None = None,
    warmup: float = WARMUP,
    window: float = WINDOW,
    engine: Any = None,
    runs: list[WindowStats] | None = None,
    mapper: Mapper | None = None,
    resume: bool = False,
) -> E0aSummary:
    """λ_ref (turns-based all-miss session rate) and the all-miss uncached token rate. Pass a list
    as `runs` to receive the per-seed statistics too. A saturation check at the E0a population
    itself is the first seed's run (the same population and seed: one run, not two in one folder)."""
    calls, check_at = e0a_calls(cache_off(cell), workload, seeds, n, check_n, out_dir, warmup, window, engine, resume)
    check_run_dirs(closed_planned(calls), resume)
    stats = list((mapper or serial)(closed_stats, calls))
    per_seed = stats[: len(seeds)]
    check = stats[check_at] if check_at is not None else None
    summary = e0a_summary(per_seed, check)
    if runs is not None:
        runs.extend(per_seed)
    return summary


# -- E0b ---------------------------------------------------------------------------------------
