"""Sweeps on the cluster: a test's or a calibration stage's simulated runs as one SLURM job array.

A user with many seeds, cells or calibration points outgrows one machine; the runs are independent
and deterministic (virtual time), so they can run anywhere and give the same records. `SlurmSweep`
maps a module-level function over a list of argument tuples as one job array through submitit
(`map_array`), waits for every task, and hands back each task's return value, or the error it
ended with, in the order of the calls. The records the runs write go where the calls say (a shared
folder on a real cluster). Afterwards the array's accounting is exported beside them, as for a
registered submission.

`agentload test run ... --executor slurm` and `agentload calibrate ... --executor slurm` use it
(cli/run.py, runs/calibration.py); a sweep is not a registered test, so
its jobs do not enforce a registration.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness.errors import UsageError
from slurm.accounting_export import write_accounting_export
from slurm.budget import parse_time_minutes
from slurm.executors import HOLD, job_parameters, release_held, sbatch_setup
from slurm.job_options import JobOptions, job_options_from_args
from slurm.parsers import JobState
from slurm.scheduler import SchedulerError, accounting, wait_for_accounting

#: Time limit of a sweep task when --time is not given, minutes.
DEFAULT_TASK_MIN = 60


@dataclass
class Outcome:
    """One task: its return value, or the error it ended with."""

    ok: bool
    value: Any
    error: str | None
    job_id: str
    state: JobState


class SweepError(SchedulerError):
    """A task of a sweep failed where every task is needed (a calibration stage)."""


def _code_root() -> Path:
    return Path(harness.__file__).resolve().parent.parent


class SlurmSweep:
    """Run calls as one job array; `map` returns Outcomes, calling the object returns values."""

    def __init__(
        self,
        folder: str | Path,
        *,
        job: JobOptions | None = None,
        name: str = "agentload-sweep",
        echo: Callable[[str], None] | None = None,
        poll_s: float = 2.0,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.job = job or JobOptions()
        self.time_min = parse_time_minutes(self.job.time) if self.job.time else DEFAULT_TASK_MIN
        self.name = name
        self.echo = echo or (lambda m: print(m, file=sys.stderr, flush=True))
        self.poll_s = poll_s
        self.job_ids: list[str] = []

    def _executor(self) -> Any:
        import submitit

        root = _code_root()
        ex = submitit.SlurmExecutor(folder=self.folder / "%j", python=self.job.python or sys.executable)
        ex.update_parameters(time=self.time_min, job_name=self.name, setup=sbatch_setup(root, self.job.job_env),
                             additional_parameters={"chdir": str(root), **HOLD},  # released in map()
                             **job_parameters(self.job))  # fmt: skip
        return ex

    def map(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], labels: Sequence[str] | None = None
    ) -> list[Outcome]:
        """Every call as one array task; blocks until all ended."""
        if not calls:
            return []
        ex = self._executor()
        columns = list(zip(*calls))
        jobs = ex.map_array(fn, *columns)
        ids = [str(j.job_id) for j in jobs]
        release_held(ids)  # submitted held: their log folders exist now
        self.job_ids += ids
        array_id = ids[0].split("_")[0]
        self.echo(
            f"submitted {len(jobs)} task(s) of {getattr(fn, '__name__', fn)} as SLURM array {array_id} (folder "
            f"{self.folder})"
        )
        done_before = -1
        while True:
            done = sum(1 for j in jobs if j.done())
            if done != done_before:
                self.echo(f"array {array_id}: {done}/{len(jobs)} task(s) ended")
                done_before = done
            if done == len(jobs):
                break
            time.sleep(self.poll_s)
        states = self._states(array_id)
        out = []
        for i, j in enumerate(jobs):
            state = states.get(str(j.job_id), JobState.UNKNOWN)
            try:
                out.append(Outcome(True, j.result(), None, str(j.job_id), state))
            except Exception as exc:  # a failed task is an outcome, not a crash of the sweep
                what = labels[i] if labels else f"task {i}"
                msg = str(exc).strip().splitlines()
                out.append(
                    Outcome(
                        False, None, f"{what}: {state}: {msg[-1] if msg else type(exc).__name__}", str(j.job_id), state
                    )
                )
        return out

    @staticmethod
    def _states(array_id: str) -> dict[str, JobState]:
        """Each task's final state from one accounting call (submitit's cached state can be stale)."""
        try:
            return {r.job_id: r.state for r in accounting([array_id])}
        except SchedulerError:
            return {}

    def __call__(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """A mapper: the values in call order; raises SweepError naming every failed task."""
        outcomes = self.map(fn, calls)
        bad = [o for o in outcomes if not o.ok]
        if bad:
            raise SweepError(
                f"{len(bad)} of {len(outcomes)} SLURM task(s) failed: "
                + "; ".join(f"job {o.job_id}: {o.error}" for o in bad[:5])
            )
        return [o.value for o in outcomes]

    def export_accounting(self, folder: str | Path) -> Path | None:
        """The scheduler's record of every task run so far, as accounting.json/.csv in `folder`."""
        if not self.job_ids:
            return None
        rows = wait_for_accounting(self.job_ids, count=len(self.job_ids), timeout_s=60.0)
        out = Path(folder)
        write_accounting_export(rows, out / "accounting.csv")
        return write_accounting_export(rows, out / "accounting.json")


def sweep_from_args(args: Any, folder: str | Path) -> SlurmSweep:
    """A sweep from the `--executor slurm` options of `test run` / `calibrate` (the job options
    `submit` takes, slurm/job_options.py)."""
    try:
        return SlurmSweep(
            folder, job=job_options_from_args(args), name=f"agentload-{getattr(args, 'sweep_name', 'sweep')}"
        )
    except ValueError as exc:  # a --time sbatch cannot read
        raise UsageError(str(exc)) from None
