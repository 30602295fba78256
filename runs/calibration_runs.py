"""The runs of each calibration stage and their directories: the list of runs a stage makes (the
arguments of runs/calibration.py's module-level run functions, so a job array can run them too),
which recorded run may be summarised instead of run again (`resume`), and the check, before the
first run, that no two runs share a directory and that no directory already holds a run the stage
would have to overwrite.

Why before the first run: a calibration on a real engine spends minutes to hours of engine time,
and a run directory that is taken (by an earlier attempt, or by two runs of one stage, such as an
E0a population equal to its saturation check) was found only when that run's recorder opened it,
after every earlier run had been paid for. Checked up front, the refusal costs nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from harness.config import ArmConfig, CellConfig, ProtocolConfig, WorkloadConfig, config_ref, load_config
from harness.errors import ConfigError
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan

# Cell settings that change what the engine does (a cell's name, description, references and cost
# model do not): a run recorded under the same values measured the same thing.
ENGINE_FIELDS = (
    "engine",
    "model",
    "kv_pool_tokens",
    "page_size",
    "schedule_policy",
    "chunked_prefill",
    "max_running",
    "prefix_cache",
    "waiting_prefix_refresh",
    "batching",
    "context_length",
    "launch_extras",
)


def completed_run(run_dir: Path | str | None, cell: CellConfig, workload: WorkloadConfig, want: dict[str, Any]) -> bool:
    """Does `run_dir` hold a COMPLETED run of this cell's engine settings, this workload and the
    `want` meta values (population, seed, warm-up, ...)? Then it can be summarised, not rerun."""
    if run_dir is None:
        return False
    path = Path(run_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if meta.get("status") != "COMPLETED":
        return False
    c = cell.model_dump(mode="json")
    got_cell = meta.get("cell") or {}
    if any(got_cell.get(k) != c.get(k) for k in ENGINE_FIELDS):
        return False
    if meta.get("workload") != workload.model_dump(mode="json"):
        return False
    return all(_same(meta.get(k), v) for k, v in want.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return bool(a == b)


def holds_run(run_dir: Path | str | None) -> bool:
    """A directory holds a run once its recorder wrote meta.json (whatever the run's status)."""
    return run_dir is not None and (Path(run_dir) / "meta.json").exists()


def _status(run_dir: Path | str) -> str:
    try:
        return str(json.loads((Path(run_dir) / "meta.json").read_text()).get("status"))
    except (OSError, ValueError, AttributeError):
        return "unreadable"


@dataclass(frozen=True)
class PlannedRun:
    """One run a stage is about to make: where it records, what it is (for messages), and whether
    the run already recorded there is one `resume` summarises (called only when it holds a run)."""

    run_dir: str | None
    what: str
    resumable: Callable[[], bool]


def check_run_dirs(planned: Sequence[PlannedRun], resume: bool) -> None:
    """Refuse, before anything runs, a directory two planned runs share, and a directory that
    already holds a run the stage would not summarise (any run without `resume`; with it, one that
    is not a COMPLETED run of the same settings). Raises ConfigError naming each directory."""
    problems: list[str] = []
    first: dict[str, str] = {}
    for p in planned:
        if p.run_dir is None:
            continue
        key = str(Path(p.run_dir).resolve())
        if key in first:
            problems.append(
                f"{p.run_dir}: {first[key]} and {p.what} would both record here; expected one run per directory"
            )
            continue
        first[key] = p.what
        if not holds_run(p.run_dir):
            continue
        if not resume:
            problems.append(
                f"{p.run_dir}: already holds a run ({_status(p.run_dir)}) where {p.what} would record; "
                "expected a fresh --out, or --resume to summarise its COMPLETED runs"
            )
        elif not p.resumable():
            problems.append(
                f"{p.run_dir}: holds a {_status(p.run_dir)} run that is not {p.what} under these settings, so "
                "--resume cannot summarise it; expected it moved away, or a fresh --out"
            )
    if len(problems) == 1:
        raise ConfigError(f"{problems[0]}; nothing was run")
    if problems:
        head = f"{len(problems)} calibration run directories are taken; nothing was run"
        raise ConfigError("\n".join([head, *(f"  {x}" for x in problems)]))


# -- the runs of each stage ----------------------------------------------------------------------
def closed_want(engine: Any, n: int, seed: int, warmup: float, window: float) -> dict[str, Any]:
    """The meta.json values a recorded closed run must have for `resume` to summarise it."""
    return {
        "run_kind": "closed",
        "engine_kind": "sim" if engine is None else engine.engine,
        "population": n,
        "seed": seed,
        "warmup": warmup,
        "window": window,
    }


def stage_c_calls(
    cell: CellConfig,
    workload: WorkloadConfig,
    ns: Sequence[int],
    seeds: Sequence[int],
    out_dir: Path | str | None,
    warmup: float,
    window: float,
    engine: Any,
    resume: bool,
) -> list[tuple[Any, ...]]:
    """The `closed_stats` arguments of every Stage C run, n by n."""
    return [
        (
            cell,
            workload,
            n,
            s,
            warmup,
            window,
            None if out_dir is None else str(Path(out_dir) / f"stage-c-n{n}-s{s}"),
            {"stage": "C"},
            engine,
            resume,
        )
        for n in ns
        for s in seeds
    ]


def closed_planned(calls: Sequence[tuple[Any, ...]]) -> list[PlannedRun]:
    """The closed runs of `closed_stats` calls, for the run-directory check."""
    out = []
    for cell, workload, n, seed, warmup, window, run_dir, meta, engine, _resume in calls:
        want = closed_want(engine, n, seed, warmup, window)
        stage = "Stage C" if meta.get("stage") == "C" else str(meta.get("stage"))
        out.append(
            PlannedRun(
                run_dir, f"the {stage} run n={n} seed {seed}", partial(completed_run, run_dir, cell, workload, want)
            )
        )
    return out


def e0a_calls(
    off: CellConfig,
    workload: WorkloadConfig,
    seeds: Sequence[int],
    n: int,
    check_n: int | None,
    out_dir: Path | str | None,
    warmup: float,
    window: float,
    engine: Any,
    resume: bool,
) -> tuple[list[tuple[Any, ...]], int | None]:
    """The `closed_stats` arguments of E0a's runs of `off` (the cell with its cache off: one run per
    seed at n, then the check at check_n on the first seed) and the index of the check's statistics
    among them: that of the first seed's run when check_n is n, None without a check."""

    def call(pop: int, s: int) -> tuple[Any, ...]:
        rd = None if out_dir is None else str(Path(out_dir) / f"e0a-n{pop}-s{s}")
        return (off, workload, pop, s, warmup, window, rd, {"stage": "E0a"}, engine, resume)

    calls = [call(n, s) for s in seeds]
    if not check_n:
        return calls, None
    if check_n == n:
        return calls, 0
    return [*calls, call(check_n, seeds[0])], len(calls)


def e0b_calls(
    cell: CellConfig,
    workload: WorkloadConfig,
    lambda_ref: float,
    grid: Sequence[float],
    seeds: Sequence[int],
    prot: ProtocolConfig,
    final_max: float,
    rise_max: float,
    out_dir: Path | str | None,
    engine: Any,
    top_rate: float,
    resume: bool,
) -> list[tuple[Any, ...]]:
    """The `from_empty_stats` arguments of every E0b run, multiple by multiple."""
    rise_span = prot.window.end - prot.window.start
    return [
        (
            cell,
            workload,
            m,
            lambda_ref,
            s,
            prot,
            rise_span,
            final_max,
            rise_max,
            None if out_dir is None else str(Path(out_dir) / f"e0b-m{m:g}-s{s}"),
            engine,
            top_rate,
            resume,
        )
        for m in grid
        for s in seeds
    ]


def from_empty_planned(calls: Sequence[tuple[Any, ...]]) -> list[PlannedRun]:
    """The E0b runs of `from_empty_stats` calls, for the run-directory check."""
    return [
        PlannedRun(c[9], f"the E0b run at {c[2]:g} x lambda_ref seed {c[4]}", partial(_call_resumable, c))
        for c in calls
    ]


def _call_resumable(call: tuple[Any, ...]) -> bool:
    """Would `from_empty_stats(*call)` summarise the run already in its directory?"""
    cell, workload, m, lam, seed, prot, _span, _fmax, _rmax, run_dir, engine, top_rate, _resume = call
    plan = make_plan(workload, prot, load_config(config_ref("noburst", "arms"), ArmConfig), m, lam, seed, top_rate)
    return from_empty_resumable(run_dir, cell, workload, m, lam, seed, prot, engine, plan)


def from_empty_resumable(
    run_dir: Path | str | None,
    cell: CellConfig,
    workload: WorkloadConfig,
    multiple: float,
    lambda_ref: float,
    seed: int,
    prot: ProtocolConfig,
    engine: Any,
    plan: Any,
) -> bool:
    """Does `run_dir` hold a COMPLETED E0b run of these settings that played exactly `plan`?"""
    want = {
        "run_kind": "from_empty",
        "engine_kind": "sim" if engine is None else engine.engine,
        "seed": seed,
        "rate": float(multiple),
        "protocol": prot.model_dump(mode="json"),
        "references": {"lambda_ref": float(lambda_ref)},
    }
    return completed_run(run_dir, cell, workload, want) and _plan_sha(run_dir) == _plan_sha256(plan)


def _plan_sha(run_dir: Path | str | None) -> str | None:
    try:
        return str(json.loads((Path(run_dir) / "meta.json").read_text())["plan"]["sha256"])  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _plan_sha256(plan: Any) -> str:
    return hashlib.sha256(plan_bytes(plan)).hexdigest()


def e0b_planned_before_e0a(
    cell: CellConfig,
    workload: WorkloadConfig,
    ea_calls: Sequence[tuple[Any, ...]],
    eb_args: tuple[Any, ...],
    lambda_ref_now: Callable[[], float],
) -> list[PlannedRun]:
    """E0b's runs for the check `calibrate all` makes before Stage C, when E0b's lambda_ref is not
    measured yet. A recorded E0b run can be resumed only at the lambda_ref it was made at: when
    every E0a run is itself resumed, `lambda_ref_now()` summarises them (no engine time) and the
    E0b runs are checked against it; when an E0a run is still to be made, they are refused now.
    `eb_args`: grid, seeds, protocol, final_max, rise_max, runs folder, engine, top rate, resume."""
    grid, seeds, prot, final_max, rise_max, runs, engine, top_rate, resume = eb_args
    taken = resume and any(holds_run(Path(runs) / f"e0b-m{m:g}-s{s}") for m in grid for s in seeds)
    if taken and all(holds_run(p.run_dir) and p.resumable() for p in closed_planned(ea_calls)):
        lam = lambda_ref_now()
        calls = e0b_calls(cell, workload, lam, grid, seeds, prot, final_max, rise_max, runs, engine, top_rate, resume)
        return from_empty_planned(calls)
    later = " at the lambda_ref of E0a runs still to be made" if taken else ""
    return [
        PlannedRun(str(Path(runs) / f"e0b-m{m:g}-s{s}"), f"the E0b run at {m:g} x lambda_ref seed {s}{later}", _never)
        for m in grid
        for s in seeds
    ]


def _never() -> bool:
    return False
