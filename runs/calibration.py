"""Calibration stages: Stage C (closed curve μ(n)), E0a (all-miss capacity), E0b (from-empty edge),
and `calibrate all`, which runs the three and writes the registration's input summaries.

Protocols (paper App. E.3): a closed population of n sessions starts at t = 0, a finished session
is replaced at once, and statistics are taken over a window after a warm-up (900 s + 1800 s).
Stage C runs the cell as configured for each n; E0a runs it with the prefix cache disabled at 32
sessions for seeds 0-2, plus a 64-session check that the engine is saturated (the token rate
should not move). E0b plays Poisson arrivals (the NOBURST plan of the e0b protocol, so the
arrivals at each multiple are a CRN subset of the next) from an empty engine for 3000 s at a grid
of multiples of λ_ref; a run is stable iff its final backlog is below 50 and the fitted rise over
the last 1500 s is at most 10 (registered parameters). Every stage writes the same run records as
a real run when given a directory.

`agentload calibrate stage-c|e0a|e0b|all --cell CELL --engine sim|emulator|vllm|sglang` is the
command (cli/calibrate.py). On a real engine every run gets a fresh server (launched through the engine adapter, with
the smoke checks and the flush + canary before it, or a cache-off check for E0a), the same clients
driven in wall time, and the same statistics (analysis/calibration.py). `calibrate all` writes
stage-c.yaml, e0a.yaml and e0b.yaml (docs/registration.md), each with the SHA-256 of the run
directories it summarises: the inputs `prereg fill` reads.

A cell faster or slower than the paper's is calibrated under its own scaled protocol: the E0b
protocol is named (configs/protocols/e0b-cpu.yaml: the paper's times divided by the scale, bins
included), and its plans are thinned from a base stream at the test's registered top rate. With
`resume`, a run directory that already holds a COMPLETED run of the same population, seed,
times, cell and workload is summarised instead of run again: on a shared machine a stage that
died half way need not start over, and what was measured is what is summarised.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.calibration import (
    E0B_FINAL_MAX,
    E0B_RISE_MAX,
    E0aSummary,
    E0bStats,
    WindowStats,
)
from analysis.calibration_summaries import e0a_summary_dict, e0b_summary_dict, stage_c_summary, write_summary
from harness.config import (
    DEFAULT_TOP_RATE,
    CellConfig,
    WorkloadConfig,
)
from runs.calibration_runs import check_run_dirs, closed_planned, e0a_calls, e0b_planned_before_e0a, stage_c_calls
from runs.closed_runs import (
    E0A_CHECK_N,
    E0A_N,
    E0A_SEEDS,
    STAGE_C_NS,
    WARMUP,
    WINDOW,
    Mapper,
    RunEndedError,
    cache_off,
    e0a,
    stage_c,
)
from runs.from_empty import E0B_DURATION, E0B_GRID, E0B_SEEDS, e0b, e0b_protocol

#: The stage functions and their defaults are here too: `calibrate all` and the commands that run
#: one stage (cli/calibrate.py) or cost a campaign (slurm/campaign.py) read them from this module.
__all__ = [
    "E0A_CHECK_N",
    "E0A_N",
    "E0A_SEEDS",
    "E0B_DURATION",
    "E0B_GRID",
    "E0B_SEEDS",
    "STAGE_C_NS",
    "WARMUP",
    "WINDOW",
    "Bundle",
    "RunEndedError",
    "calibrate_all",
    "e0a",
    "e0b",
    "e0b_protocol",
    "load_note",
    "stage_c",
    "write_e0a_file",
    "write_stage_c_file",
]


# -- the bundle ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bundle:
    """What `calibrate all` wrote: the three summaries (path, SHA-256) and the statistics."""

    files: dict[str, tuple[Path, str]]
    stage_c: list[WindowStats]
    e0a: E0aSummary
    e0b: list[E0bStats]


def calibrate_all(
    cell: CellConfig,
    workload: WorkloadConfig,
    out: Path | str,
    *,
    runs_dir: Path | str | None = None,
    ns: Sequence[int] = STAGE_C_NS,
    stage_c_seeds: Sequence[int] = (0,),
    e0a_seeds: Sequence[int] = E0A_SEEDS,
    e0a_n: int = E0A_N,
    check_n: int | None = E0A_CHECK_N,
    warmup: float = WARMUP,
    window: float = WINDOW,
    grid: Sequence[float] = E0B_GRID,
    e0b_seeds: Sequence[int] = E0B_SEEDS,
    e0b_duration: float | None = None,
    rise_span: float | None = None,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    engine: Any = None,
    engine_name: str = "sim",
    log: Any = None,
    mapper: Mapper | None = None,
    e0b_protocol_ref: str = "e0b",
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
) -> Bundle:
    """Stage C, E0a, then E0b at multiples of the λ_ref E0a just measured; writes stage-c.yaml,
    e0a.yaml and e0b.yaml into `out` (run directories under `runs_dir`, default out/runs).
    E0b runs under the protocol `e0b_protocol_ref` (its duration and window unless given)."""
    out = Path(out)
    runs = Path(runs_dir) if runs_dir is not None else out / "runs"
    say = log or (lambda msg: None)
    eprot = e0b_protocol(e0b_duration, rise_span, e0b_protocol_ref)
    e0b_duration, rise_span = eprot.duration, eprot.window.end - eprot.window.start
    src = (
        f"agentload calibrate all --cell {cell.name} --engine {engine_name}: Stage C n={list(ns)} seeds "
        f"{list(stage_c_seeds)} "
        f"({warmup:g} s + {window:g} s); E0a n={e0a_n} seeds {list(e0a_seeds)} check n={check_n}; "
        f"E0b {e0b_protocol_ref} grid {list(grid)} seeds {list(e0b_seeds)}, {e0b_duration:g} s"
    )
    if top_rate != DEFAULT_TOP_RATE:
        src += f", top rate {top_rate:g} sessions/s"
    sc_calls = stage_c_calls(cell, workload, ns, stage_c_seeds, runs, warmup, window, engine, resume)
    ea_calls, _ = e0a_calls(cache_off(cell), workload, e0a_seeds, e0a_n, check_n, runs, warmup, window, engine, resume)
    planned = closed_planned(sc_calls) + closed_planned(ea_calls)
    eb_args = (grid, e0b_seeds, eprot, final_max, rise_max, runs, engine, top_rate, resume)

    def lambda_ref_now() -> float:  # E0a summarised from its recorded runs (all resumed: no engine time)
        return e0a(
            cell,
            workload,
            seeds=e0a_seeds,
            n=e0a_n,
            check_n=check_n,
            out_dir=runs,
            warmup=warmup,
            window=window,
            engine=engine,
            resume=True,
        ).lambda_ref

    check_run_dirs(planned + e0b_planned_before_e0a(cell, workload, ea_calls, eb_args, lambda_ref_now), resume)
    say(f"Stage C: n = {list(ns)}")
    sc = stage_c(
        cell,
        workload,
        ns,
        seeds=stage_c_seeds,
        out_dir=runs,
        warmup=warmup,
        window=window,
        engine=engine,
        mapper=mapper,
        resume=resume,
    )
    sc_dirs = [Path(c[6]) for c in sc_calls]
    say(f"E0a: n = {e0a_n}, seeds {list(e0a_seeds)}")
    per_seed: list[WindowStats] = []
    ea = e0a(
        cell,
        workload,
        seeds=e0a_seeds,
        n=e0a_n,
        check_n=check_n,
        out_dir=runs,
        warmup=warmup,
        window=window,
        engine=engine,
        runs=per_seed,
        mapper=mapper,
        resume=resume,
    )
    ea_dirs = [Path(c[6]) for c in ea_calls]  # a check at the E0a population is the first seed's run
    lam = ea.lambda_ref
    say(f"E0b: grid {list(grid)} x lambda_ref = {lam:.5f} sessions/s")
    eb = e0b(
        cell,
        workload,
        lam,
        grid=grid,
        seeds=e0b_seeds,
        duration=e0b_duration,
        rise_span=rise_span,
        final_max=final_max,
        rise_max=rise_max,
        out_dir=runs,
        engine=engine,
        protocol=e0b_protocol_ref,
        top_rate=top_rate,
        resume=resume,
        mapper=mapper,
    )
    eb_dirs = [runs / f"e0b-m{m:g}-s{s}" for m in grid for s in e0b_seeds]
    files: dict[str, tuple[Path, str]] = {}
    docs = {
        "stage-c": stage_c_summary(
            cell.name, sc, warmup=warmup, window=window, run_dirs=sc_dirs, folder=out, source=src + load_note(sc_dirs)
        ),
        "e0a": e0a_summary_dict(
            cell.name,
            per_seed,
            ea,
            n=e0a_n,
            warmup=warmup,
            window=window,
            run_dirs=ea_dirs,
            folder=out,
            source=src + load_note(ea_dirs),
        ),
        "e0b": e0b_summary_dict(
            cell.name,
            eb,
            lambda_ref=lam,
            grid=list(grid),
            seeds=list(e0b_seeds),
            duration=e0b_duration,
            rise_span=rise_span,
            final_max=final_max,
            rise_max=rise_max,
            run_dirs=eb_dirs,
            folder=out,
            source=src + load_note(eb_dirs),
            bin_s=eprot.backlog_bin,
            top_rate=top_rate,
            protocol=e0b_protocol_ref,
        ),
    }
    for stage, data in docs.items():
        path = out / f"{stage}.yaml"
        files[stage] = (path, write_summary(data, path))
    return Bundle(files, sc, ea, eb)


def load_note(run_dirs: Sequence[Path]) -> str:
    """The host load the real runs of a stage ran under, for its summary's `source` ('' for
    simulated runs): the range of the 1-minute load average over the drives and of the share of
    a core the engine got (meta.json host_load, runs/realrun.py)."""
    loads: list[float] = []
    shares: list[float] = []
    cpus = None
    for d in run_dirs:
        try:
            hl = json.loads((Path(d) / "meta.json").read_text()).get("host_load") or {}
        except (OSError, ValueError):
            continue
        cpus = hl.get("cpus", cpus)
        loads += [float(v[0]) for k, v in hl.items() if k in ("loadavg_drive_start", "loadavg_drive_end") and v]
        if hl.get("engine_cpu_share") is not None:
            shares.append(float(hl["engine_cpu_share"]))
    if not loads:
        return ""
    note = f"; host load (1 min) {min(loads):.1f}-{max(loads):.1f} on {cpus} CPUs"
    if shares:
        note += f", engine CPU share {min(shares):.2f}-{max(shares):.2f} of a core"
    return note


# -- one stage's summary ---------------------------------------------------------------------
def write_stage_c_file(
    cell: CellConfig,
    workload: WorkloadConfig,
    stats: list[WindowStats],
    out: Path | str,
    *,
    ns: Sequence[int],
    seeds: Sequence[int],
    warmup: float,
    window: float,
    engine: Any,
    engine_name: str,
) -> tuple[Path, str]:
    """stage-c.yaml for a Stage C run on its own (`calibrate stage-c --out`), in the very format
    `calibrate all` writes: a cell calibrated stage by stage (a slow real engine, where E0b is not
    worth its hours yet) still gets the summary that `prereg`, the design step and the cell's
    references read, bound to its run directories by hash. Returns (path, SHA-256)."""
    out = Path(out)
    dirs = [Path(c[6]) for c in stage_c_calls(cell, workload, ns, seeds, out, warmup, window, engine, True)]
    src = (
        f"agentload calibrate stage-c --cell {cell.name} --engine {engine_name}: n={list(ns)} seeds {list(seeds)} "
        f"({warmup:g} s + {window:g} s)"
    )
    data = stage_c_summary(
        cell.name, stats, warmup=warmup, window=window, run_dirs=dirs, folder=out, source=src + load_note(dirs)
    )
    path = out / "stage-c.yaml"
    return path, write_summary(data, path)


def write_e0a_file(
    cell: CellConfig,
    workload: WorkloadConfig,
    per_seed: list[WindowStats],
    summary: E0aSummary,
    out: Path | str,
    *,
    seeds: Sequence[int],
    n: int,
    check_n: int | None,
    warmup: float,
    window: float,
    engine: Any,
    engine_name: str,
) -> tuple[Path, str]:
    """e0a.yaml for an E0a run on its own (`calibrate e0a --out`), as `calibrate all` writes it
    (why: write_stage_c_file). Returns (path, SHA-256)."""
    out = Path(out)
    calls, _ = e0a_calls(cache_off(cell), workload, seeds, n, check_n, out, warmup, window, engine, True)
    dirs = [Path(c[6]) for c in calls]
    src = (
        f"agentload calibrate e0a --cell {cell.name} --engine {engine_name}: n={n} seeds {list(seeds)} "
        f"check n={check_n} ({warmup:g} s + {window:g} s)"
    )
    data = e0a_summary_dict(
        cell.name,
        per_seed,
        summary,
        n=n,
        warmup=warmup,
        window=window,
        run_dirs=dirs,
        folder=out,
        source=src + load_note(dirs),
    )
    path = out / "e0a.yaml"
    return path, write_summary(data, path)
