"""Scheduler facts, asked of SLURM's own commands (`squeue`, `sacct`), never of a user.

The provenance record (SPEC section 7) takes a job's submit, start and end times, its state and exit
code, and the comment it was submitted with from the scheduler's accounting; a job script takes the
time it has left from the controller. This module is the one place that runs those commands; what
they print is read by slurm/parsers.py, and the accounting is written beside a test's runs by
slurm/accounting_export.py.

Public interface:

- `time_left_s(job_id=None)`: seconds the job has left (`squeue -h -j ID -o %L`); `job_facts`: the
  same with the time limit, partition and nodes.
- `job_states(ids)`: current `JobState` of each job (`squeue`, then `sacct` for jobs the controller
  has forgotten).
- `release(ids)`: `scontrol release` of jobs submitted held (slurm/executors.py: submitit makes a
  job's log folder only after sbatch returns, so a job started at once could not open its stdout).
- `accounting(job_ids=None, comment=None, since=None)`: typed `AccountingRow`s from
  `sacct --parsable2 --noheader -X --format=...` (run with `SLURM_TIME_FORMAT=%s`: zone-free epoch
  timestamps); `wait_for_accounting(ids)` waits until those rows are final (`AccountingRow.settled`:
  slurmdbd fills a row in stages).

Errors. Every failure is a `SchedulerError` with the command, exit status and stderr;
`SchedulerUnavailable` when the command is missing or the controller / database cannot be reached,
`AccountingDisabled` when the cluster runs without slurmdbd (`sacct` then has no jobs at all),
`JobNotFound` when the controller does not know a job.

Commands run through a `Runner` (argv, env -> `CommandResult`); tests pass a fake one.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from harness.errors import SchedulerError as _SchedulerError
from slurm.parsers import (
    ACCOUNTING_FIELDS,
    AccountingRow,
    JobState,
    local_timezone,
    parse_duration,
    parse_sacct,
    parse_squeue_states,
    parse_time_left,
)

__all__ = [
    "AccountingDisabled",
    "CommandResult",
    "JobFacts",
    "JobNotFound",
    "Runner",
    "SchedulerError",
    "SchedulerUnavailable",
    "accounting",
    "job_facts",
    "job_states",
    "release",
    "run_command",
    "time_left_s",
    "wait_for_accounting",
]


# ------------------------------------------------------------------------------------------- errors
class SchedulerError(_SchedulerError):
    """A scheduler command failed; `argv`, `returncode` and `stderr` say how."""

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None, stderr: str = ""):
        detail = message
        if argv:
            detail += f"\n  command: {' '.join(argv)}"
        if returncode is not None:
            detail += f"\n  exit status: {returncode}"
        if stderr.strip():
            detail += f"\n  stderr: {stderr.strip()}"
        super().__init__(detail)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


class SchedulerUnavailable(SchedulerError):
    """The command is not installed, or the controller / accounting daemon does not answer."""


class AccountingDisabled(SchedulerError):
    """The cluster runs without accounting storage (no slurmdbd): `sacct` knows no jobs."""


class JobNotFound(SchedulerError):
    """The controller does not know the job (never submitted, or finished longer ago than MinJobAge)."""


# ------------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


#: Runs argv with extra environment variables and returns its result. Must not raise on a non-zero exit
#: status; raises FileNotFoundError when the program does not exist.
Runner = Callable[[Sequence[str], Mapping[str, str]], CommandResult]


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 60.0) -> CommandResult:
    """The default `Runner`: subprocess with the current environment plus `env`."""
    full_env = {**os.environ, **env}
    try:
        proc = subprocess.run(list(argv), env=full_env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SchedulerUnavailable(f"{argv[0]} did not answer within {timeout_s:.0f} s", argv=argv) from exc
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


def _call(argv: Sequence[str], runner: Runner | None, env: Mapping[str, str] | None = None) -> CommandResult:
    run = runner or run_command
    try:
        return run(list(argv), dict(env or {}))
    except FileNotFoundError as exc:
        raise SchedulerUnavailable(
            f"{argv[0]} is not installed or not on PATH (start the local cluster with slurm/local/cluster.sh up)",
            argv=argv,
        ) from exc


_UNREACHABLE = (
    "unable to contact slurm controller",
    "connection refused",
    "problem talking to the database",
    "socket timed out",
    "zero bytes were transmitted or received",
    "munge",
)


def _raise_for(result: CommandResult, argv: Sequence[str], what: str) -> None:
    err = result.stderr
    low = err.lower()
    if "accounting storage is disabled" in low:
        raise AccountingDisabled(
            "Slurm accounting storage is disabled: this cluster runs without slurmdbd, so sacct has no "
            "jobs (configure AccountingStorageType=accounting_storage/slurmdbd; the local cluster does)",
            argv=argv,
            returncode=result.returncode,
            stderr=err,
        )
    if any(marker in low for marker in _UNREACHABLE):
        raise SchedulerUnavailable(
            f"{what}: the scheduler does not answer", argv=argv, returncode=result.returncode, stderr=err
        )
    raise SchedulerError(f"{what} failed", argv=argv, returncode=result.returncode, stderr=err)


def _ids(job_ids: Iterable[int | str]) -> list[str]:
    out = [str(j).strip() for j in job_ids]
    for j in out:
        if not re.fullmatch(r"\d+(?:_\d+)?", j):
            raise ValueError(f"not a Slurm job id: {j!r}")
    return out


def release(job_ids: Iterable[int | str], *, runner: Runner | None = None) -> None:
    """Release held jobs (`scontrol release ID,...`; an array's id releases all its tasks)."""
    ids = _ids(job_ids)
    if not ids:
        return
    argv = ["scontrol", "release", ",".join(ids)]
    result = _call(argv, runner)
    if result.returncode != 0:
        _raise_for(result, argv, f"releasing held job(s) {', '.join(ids)}")


def accounting(
    job_ids: Iterable[int | str] | None = None,
    *,
    comment: str | None = None,
    since: datetime | None = None,
    runner: Runner | None = None,
) -> list[AccountingRow]:
    """The scheduler's accounting for jobs, one row per job or array task (`sacct -X`: no steps).

    Select by `job_ids` (an array's id selects all its tasks), by `comment` (exact match; sacct has no
    comment filter, so jobs of all users since `since`, default the epoch, are read and filtered
    here), or both. With neither, every job since `since` (default: the epoch). Rows are in sacct's
    order. Raises `AccountingDisabled` when the cluster has no accounting storage,
    `SchedulerUnavailable` when sacct or slurmdbd cannot be reached.
    """
    argv = ["sacct", "--parsable2", "--noheader", "-X", "--format=" + ",".join(ACCOUNTING_FIELDS)]
    ids = _ids(job_ids) if job_ids is not None else None
    if ids is not None:
        if not ids:
            return []
        argv.append("--jobs=" + ",".join(ids))
    else:
        start = since or datetime(1970, 1, 2, tzinfo=UTC)
        local = start.astimezone(local_timezone()) if start.tzinfo else start
        argv += ["--allusers", "--starttime=" + local.strftime("%Y-%m-%dT%H:%M:%S"), "--endtime=now"]
    result = _call(argv, runner, {"SLURM_TIME_FORMAT": "%s"})
    if result.returncode != 0:
        _raise_for(result, argv, "sacct")
    rows = parse_sacct(result.stdout)
    if comment is not None:
        rows = [r for r in rows if r.comment == comment]
    if since is not None and ids is not None:
        rows = [r for r in rows if r.submit is None or r.submit >= since]
    return rows


def wait_for_accounting(
    job_ids: Iterable[int | str],
    *,
    count: int | None = None,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
    runner: Runner | None = None,
) -> list[AccountingRow]:
    """Accounting rows of `job_ids` once every row is `settled` (and there are `count` rows, if
    given: an array's tasks appear one by one). Raises TimeoutError with the last rows otherwise."""
    ids = _ids(job_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        rows = accounting(ids, runner=runner)
        if rows and all(r.settled for r in rows) and (count is None or len(rows) >= count):
            return rows
        if time.monotonic() >= deadline:
            raise TimeoutError(f"accounting for jobs {','.join(ids)} not final after {timeout_s:.0f} s: {rows}")
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------- squeue
def _squeue_one(job_id: int | str | None, fmt: str, caller: str, runner: Runner | None) -> tuple[str, str]:
    """(job id, the one line `squeue -h -j ID -o FMT` prints for it); $SLURM_JOB_ID by default."""
    if job_id is None:
        job_id = os.environ.get("SLURM_JOB_ID")
        if not job_id:
            raise SchedulerError(f"{caller}() needs a job id outside a SLURM job (SLURM_JOB_ID is not set)")
    (jid,) = _ids([job_id])
    argv = ["squeue", "--noheader", f"--jobs={jid}", f"--format={fmt}"]
    result = _call(argv, runner)
    if result.returncode != 0:
        if "invalid job id" in result.stderr.lower():
            raise JobNotFound(
                f"the controller does not know job {jid}", argv=argv, returncode=result.returncode, stderr=result.stderr
            )
        _raise_for(result, argv, "squeue")
    lines = [ln.strip() for ln in result.stdout.splitlines() if ln.strip()]
    if not lines:
        raise JobNotFound(f"job {jid} is not in the queue (finished?)", argv=argv, returncode=0)
    if len(lines) > 1:
        raise SchedulerError(
            f"squeue printed {len(lines)} lines for job {jid} (an array? pass one task's id)", argv=argv
        )
    return jid, lines[0]


def time_left_s(job_id: int | str | None = None, *, runner: Runner | None = None) -> float | None:
    """Seconds the job has left before the scheduler's time limit, from `squeue -h -j ID -o %L`.

    `job_id` defaults to $SLURM_JOB_ID (inside a job). Returns `math.inf` when the job has no limit,
    0.0 when it is past its limit, None when no limit is set yet; see `parse_time_left`. The value is
    whole seconds (Slurm's resolution). Raises `JobNotFound` when the controller does not know the job.
    """
    _, line = _squeue_one(job_id, "%L", "time_left_s", runner)
    return parse_time_left(line)


@dataclass(frozen=True)
class JobFacts:
    """What the controller says about a running job: its time left and limit (seconds; `math.inf`
    unlimited, None not set), with Slurm's own text, its partition and node list."""

    job_id: str
    time_left_s: float | None
    time_left: str
    time_limit_s: float | None
    time_limit: str
    partition: str
    nodes: str


def job_facts(job_id: int | str | None = None, *, runner: Runner | None = None) -> JobFacts:
    """Time left (`%L`, as `time_left_s`), time limit (`%l`), partition and nodes of a job, from one
    `squeue -h -j ID -o %L|%l|%P|%N` call ($SLURM_JOB_ID by default). Raises `JobNotFound` like
    `time_left_s`."""
    jid, line = _squeue_one(job_id, "%L|%l|%P|%N", "job_facts", runner)
    left, limit, partition, nodes = ([*line.split("|"), "", "", "", ""])[:4]
    return JobFacts(
        jid, parse_time_left(left), left.strip(), parse_duration(limit), limit.strip(), partition.strip(), nodes.strip()
    )


def _covered(requested: str, found: Iterable[str]) -> bool:
    return any(f == requested or f.startswith(requested + "_") for f in found)


def job_states(job_ids: Iterable[int | str], *, runner: Runner | None = None) -> dict[str, JobState]:
    """Current state of each job (`JobState.PENDING`, `RUNNING`, `COMPLETED`, `CANCELLED`, ...).

    Asks the controller first (`squeue -t all`, which also lists jobs finished less than MinJobAge
    ago), then accounting (`sacct`) for the jobs it no longer knows. Keys are job ids as Slurm prints
    them: an array's id yields one entry per task (`5_0`, `5_1`, ...); a task's own raw id is reported
    under `ARRAY_TASK`. Ids neither command knows are absent from the result. When accounting is
    disabled the controller's answer alone is returned.
    """
    ids = _ids(job_ids)
    if not ids:
        return {}
    argv = ["squeue", "--noheader", "--array", "--states=all", "--jobs=" + ",".join(ids), "--format=%i|%T"]
    result = _call(argv, runner)
    states: dict[str, JobState] = {}
    if result.returncode == 0:
        states.update(parse_squeue_states(result.stdout))
    elif "invalid job id" not in result.stderr.lower():
        _raise_for(result, argv, "squeue")
    # A raw task id (squeue shows its task as ARRAY_TASK) cannot be told apart from a forgotten job
    # here; sacct answers both.
    missing = [j for j in ids if not _covered(j, states)]
    if missing:
        try:
            rows = accounting(missing, runner=runner)
        except AccountingDisabled:
            return states
        for row in rows:
            states.setdefault(row.job_id, row.state)
    return states
