"""E0b: Poisson arrivals from an empty engine at a grid of multiples of lambda_ref, and the edge.

The arrivals are the NOBURST plan of the e0b protocol, so those at each multiple are a CRN subset of
the next; each run plays 3000 s (or its scaled protocol's duration) from an empty engine, and is
stable iff its final backlog is below 50 and the fitted rise over the last 1500 s is at most 10
(registered parameters, analysis/calibration.py). A scaled cell names its own E0b protocol
(configs/protocols/e0b-cpu.yaml), whose plans are thinned from a base stream at the test's top rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.calibration import (
    E0B_FINAL_MAX,
    E0B_RISE_MAX,
    E0B_RISE_SPAN,
    E0bStats,
    e0b_stats,
)
from harness.client.openloop import ListSink, PlanClient
from harness.config import (
    DEFAULT_TOP_RATE,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    WorkloadConfig,
    config_ref,
    load_config,
)
from harness.drivers.virtual import simulate
from harness.recording.record import RunRecorder, load_run
from harness.recording.schema import RunStatus
from harness.refengine.model import EngineModel
from harness.workload.planfile import read_plan, write_plan
from harness.workload.plans import make_plan
from runs.calibration_runs import check_run_dirs, e0b_calls, from_empty_planned, from_empty_resumable
from runs.closed_runs import Mapper, RunEndedError, closed_meta, serial
from runs.realrun import run_real

E0B_GRID = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0)
E0B_SEEDS = (0,)
E0B_DURATION = 3000.0


def e0b_protocol(duration: float | None = None, rise_span: float | None = None, base: str = "e0b") -> ProtocolConfig:
    """The E0b protocol `base` (configs/protocols/e0b.yaml, or a scaled one such as e0b-cpu), with
    another duration or rise span if asked (default: the protocol's duration and window): no
    burst, the statistics window = the last `rise_span` seconds, the backlog bins the protocol's."""
    cfg = load_config(config_ref(base, "protocols"), ProtocolConfig)
    duration = float(cfg.duration if duration is None else duration)
    rise_span = float(cfg.window.end - cfg.window.start if rise_span is None else rise_span)
    data = cfg.model_dump(mode="json")
    data.update(duration=float(duration), window={"start": float(duration - rise_span), "end": float(duration)})
    data["burst"] = {**data["burst"], "size": 0, "time": min(data["burst"]["time"], float(duration) / 2)}
    data["min_window"] = min(float(data["min_window"]), float(rise_span))
    return ProtocolConfig.model_validate(data)


def run_from_empty(
    cell: CellConfig,
    workload: WorkloadConfig,
    multiple: float,
    lambda_ref: float,
    *,
    seed: int = 0,
    protocol: ProtocolConfig | None = None,
    rise_span: float = E0B_RISE_SPAN,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    run_dir: Path | str | None = None,
    engine: Any = None,
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
) -> E0bStats:
    """One E0b run: the frozen NOBURST plan at multiple x lambda_ref from an empty engine, thinned
    from the base stream at `top_rate` sessions/s (a fast cell's test registers a higher one)."""
    prot = protocol or e0b_protocol(rise_span=rise_span)
    arm = load_config(config_ref("noburst", "arms"), ArmConfig)
    plan = make_plan(workload, prot, arm, multiple, lambda_ref, seed, top_rate)

    def stats(turns: pd.DataFrame, sessions: pd.DataFrame) -> E0bStats:
        return e0b_stats(
            turns,
            sessions,
            multiple=multiple,
            seed=seed,
            lambda_ref=lambda_ref,
            duration=prot.duration,
            rise_span=rise_span,
            bin_s=prot.backlog_bin,
            final_max=final_max,
            rise_max=rise_max,
        )

    if (
        resume
        and run_dir is not None
        and from_empty_resumable(run_dir, cell, workload, multiple, lambda_ref, seed, prot, engine, plan)
    ):
        data = load_run(run_dir)
        return stats(data.turns, data.sessions)
    if run_dir is None and engine is None:
        sink = ListSink()
        client = PlanClient(plan.sessions, plan.workload, sink=sink)
        simulate(client, EngineModel(cell, seed=seed), until=prot.duration, gauge_interval=None)
        return stats(pd.DataFrame(sink.turns), pd.DataFrame(sink.sessions))
    if run_dir is None:
        raise ValueError("a real-engine E0b run needs a run directory (--out)")

    rd = Path(run_dir)
    rd.mkdir(parents=True, exist_ok=True)
    sha = write_plan(plan, rd / "plan.parquet")
    plan = read_plan(rd / "plan.parquet")
    kind = "sim" if engine is None else engine.engine
    meta = {
        **closed_meta(kind, cell, workload, 0, seed, 0.0, prot.duration, {"stage": "E0b"}),
        "run_kind": "from_empty",
        "protocol": prot,
        "rate": float(multiple),
        "rate_abs": float(multiple) * lambda_ref,
        "references": {"lambda_ref": float(lambda_ref)},
        "arm": "NOBURST",
        "plan": {"file": "plan.parquet", "sha256": sha, "counts": plan.meta.get("counts"), "top_rate": plan.top_rate},
    }
    meta.pop("population", None)
    rec = RunRecorder(rd, meta)
    try:
        client = PlanClient(plan.sessions, plan.workload, sink=rec)
        if engine is None:
            res = simulate(
                client,
                EngineModel(cell, seed=seed),
                recorder=rec,
                until=prot.duration,
                gauge_interval=prot.gauge_interval,
            )
            rec.update_meta({"simulation": res.as_meta()})
            status, reason = RunStatus.COMPLETED, None
        else:
            result = run_real(
                client,
                cell=cell,
                options=engine,
                run_dir=rd,
                recorder=rec,
                duration=prot.duration,
                gauge_interval=prot.gauge_interval,
            )
            status, reason = result.status, result.reason
        client.close(prot.duration)
    except BaseException:
        rec.close(RunStatus.FAILED, "E0b run raised")
        raise
    rec.close(status, reason) if engine is None else rec.close()
    if status != RunStatus.COMPLETED:
        raise RunEndedError(
            f"E0b run at {multiple} x lambda_ref seed {seed} ended {status}: {reason} (records in {rd})"
        )
    data = load_run(rd)
    return stats(data.turns, data.sessions)


def e0b(
    cell: CellConfig,
    workload: WorkloadConfig,
    lambda_ref: float,
    *,
    grid: Sequence[float] = E0B_GRID,
    seeds: Sequence[int] = E0B_SEEDS,
    duration: float | None = None,
    rise_span: float | None = None,
    final_max: float = E0B_FINAL_MAX,
    rise_max: float = E0B_RISE_MAX,
    out_dir: Path | str | None = None,
    engine: Any = None,
    protocol: str = "e0b",
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
    mapper: Mapper | None = None,
) -> list[E0bStats]:
    """Every (multiple, seed) of the grid from empty; the same seed's arrivals nest across multiples.
    `duration` and `rise_span` default to the named protocol's duration and window."""
    prot = e0b_protocol(duration, rise_span, protocol)
    rise_span = prot.window.end - prot.window.start
    calls = e0b_calls(
        cell, workload, lambda_ref, grid, seeds, prot, final_max, rise_max, out_dir, engine, top_rate, resume
    )
    check_run_dirs(from_empty_planned(calls), resume)
    return list((mapper or serial)(from_empty_stats, calls))


def from_empty_stats(
    cell: CellConfig,
    workload: WorkloadConfig,
    multiple: float,
    lambda_ref: float,
    seed: int,
    protocol: ProtocolConfig,
    rise_span: float,
    final_max: float,
    rise_max: float,
    run_dir: str | None,
    engine: Any,
    top_rate: float = DEFAULT_TOP_RATE,
    resume: bool = False,
) -> E0bStats:
    """`run_from_empty` with positional arguments (a module-level function for job arrays)."""
    return run_from_empty(
        cell,
        workload,
        multiple,
        lambda_ref,
        seed=seed,
        protocol=protocol,
        rise_span=rise_span,
        final_max=final_max,
        rise_max=rise_max,
        run_dir=run_dir,
        engine=engine,
        top_rate=top_rate,
        resume=resume,
    )
