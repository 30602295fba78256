"""Scheduler facts, read from SLURM's own commands (`squeue`, `sacct`), never from a user.

The provenance record (SPEC section 7) takes a job's submit, start and end times, its state and exit
code, and the comment it was submitted with from the scheduler's accounting; a job script takes the
time it has left from the controller. This module is the one place that runs those commands and
parses what they print.

Public interface:

- `time_left_s(job_id=None)`: seconds the job has left (`squeue -h -j ID -o %L`).
- `job_states(ids)`: current state of each job (`squeue`, then `sacct` for jobs the controller has
  forgotten).
- `accounting(job_ids=None, comment=None, since=None)`: typed `AccountingRow`s from
  `sacct --parsable2 --noheader -X --format=...`; `wait_for_accounting(ids)` waits until those rows
  are final (`AccountingRow.settled`: slurmdbd fills a row in stages).
- `write_accounting_export(rows, path)` / `read_accounting_export(path)`: CSV or JSON with UTC and
  local time columns.
- Parsers used by the above, usable on their own: `parse_duration`, `parse_time_left`,
  `parse_timestamp`, `parse_exit_code`, `normalise_state`, `parse_sacct`.

Times. `sacct` prints timestamps in the local time of the machine it runs on, without a zone
(`2026-12-01T06:19:07`), which is ambiguous in the hour a DST change repeats. We avoid the problem at
the source: every `sacct` call here runs with `SLURM_TIME_FORMAT=%s`, which makes Slurm format its
timestamps with strftime's `%s`, seconds since the Unix epoch, a zone-free instant. Those are turned
into timezone-aware UTC datetimes. When given text in Slurm's standard format anyway (logs, another
tool's capture), `parse_timestamp` reads it as wall time in an explicit zone (`tz`, default the
machine's zone, see `local_timezone`) and converts it to UTC.

Errors. Every failure is a `SchedulerError` with the command, exit status and stderr;
`SchedulerUnavailable` when the command is missing or the controller / database cannot be reached,
`AccountingDisabled` when the cluster runs without slurmdbd (`sacct` then has no jobs at all),
`JobNotFound` when the controller does not know a job.

Commands run through a `Runner` (argv, env -> `CommandResult`); tests pass a fake one.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from harness.errors import SchedulerError as _SchedulerError

__all__ = [
    "ACCOUNTING_FIELDS",
    "EXPORT_COLUMNS",
    "TERMINAL_STATES",
    "AccountingDisabled",
    "AccountingRow",
    "CommandResult",
    "JobFacts",
    "JobNotFound",
    "Runner",
    "SchedulerError",
    "SchedulerUnavailable",
    "accounting",
    "is_terminal",
    "job_facts",
    "job_states",
    "local_timezone",
    "normalise_state",
    "parse_duration",
    "parse_exit_code",
    "parse_sacct",
    "parse_squeue_states",
    "parse_time_left",
    "parse_timestamp",
    "read_accounting_export",
    "run_command",
    "time_left_s",
    "wait_for_accounting",
    "write_accounting_export",
]

#: The `sacct --format` fields, in order. Comment is last on purpose: it is free text and may hold the
#: `|` delimiter, so a row is split into at most len(ACCOUNTING_FIELDS) fields and the rest is comment.
ACCOUNTING_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobName",
    "Submit",
    "Start",
    "End",
    "State",
    "ExitCode",
    "NodeList",
    "Timelimit",
    "Elapsed",
    "Comment",
)

#: States after which a job never runs again (Slurm's base job states).
TERMINAL_STATES: frozenset[str] = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)

# Text Slurm prints for "no value" in time and duration columns.
_NO_VALUE = frozenset({"", "NONE", "UNKNOWN", "N/A", "NOT_SET", "PARTITION_LIMIT", "INVALID"})
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "-1"})
_DURATION = re.compile(
    r"""^(?:(?P<days>\d+)-)?            # D-
        (?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+(?:\.\d+)?))?$""",
    re.X,
)
_DURATION_MS = re.compile(r"^(?P<m>\d+):(?P<s>\d+\.\d+)$")  # sacct's MM:SS.mmm (CPU times)
_ISO_LOCAL = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")


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


# ------------------------------------------------------------------------------------------ parsers
def parse_duration(text: str) -> float | None:
    """Seconds in a Slurm duration.

    Accepts what Slurm prints (`squeue %L/%l`, `sacct Elapsed/Timelimit`): `M:SS`, `MM:SS`,
    `HH:MM:SS`, `D-HH:MM:SS`, and what it accepts as input (`--time`): `MM` (minutes), `D-HH`,
    `D-HH:MM`; plus sacct's `MM:SS.mmm`. `UNLIMITED` / `INFINITE` give `math.inf`.
    `NOT_SET`, `Partition_Limit`, `INVALID`, `None`, `Unknown` and empty text give None (no value;
    see `parse_time_left` for what INVALID means there). Anything else raises ValueError.
    """
    t = text.strip()
    up = t.upper()
    if up in _UNLIMITED:
        return math.inf
    if up in _NO_VALUE:
        return None
    m = _DURATION_MS.match(t)
    if m:
        return int(m["m"]) * 60 + float(m["s"])
    m = _DURATION.match(t)
    if not m:
        raise ValueError(f"not a Slurm duration: {text!r}")
    days = int(m["days"]) if m["days"] else 0
    a, b, c = m["a"], m["b"], m["c"]
    if m["days"] is not None:
        # D-HH, D-HH:MM, D-HH:MM:SS
        if c is not None and "." in c:
            seconds = float(c)
        else:
            seconds = int(c) if c is not None else 0
        total = days * 86400 + int(a) * 3600 + (int(b) if b is not None else 0) * 60 + seconds
    elif c is not None:
        total = int(a) * 3600 + int(b) * 60 + (float(c) if "." in c else int(c))  # HH:MM:SS
    elif b is not None:
        total = int(a) * 60 + int(b)  # MM:SS
    else:
        total = int(a) * 60  # MM (input form: minutes)
    return float(total)


def parse_time_left(text: str) -> float | None:
    """Seconds left from `squeue -o %L`.

    `UNLIMITED` -> `math.inf` (no time limit). `INVALID` -> 0.0: squeue prints it when the time left is
    negative, i.e. the job has run past its limit and is about to be killed (limits are enforced about
    every 30 s). `NOT_SET` -> None (the job has no limit assigned yet). Other text as `parse_duration`.
    """
    t = text.strip().upper()
    if t == "INVALID":
        return 0.0
    return parse_duration(text)


def local_timezone() -> tzinfo:
    """The zone Slurm's commands use for local time here: $TZ, else /etc/localtime, else /etc/timezone.

    Returns a `ZoneInfo` when the zone has a name (DST rules included); a fixed offset otherwise.
    """
    candidates: list[str] = []
    tz_env = os.environ.get("TZ", "").lstrip(":")
    if tz_env:
        candidates.append(tz_env)
    try:
        target = os.path.realpath("/etc/localtime")
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    try:
        candidates.append(Path("/etc/timezone").read_text().strip())
    except OSError:
        pass
    for key in candidates:
        try:
            return ZoneInfo(key)
        except (ZoneInfoNotFoundError, ValueError):
            continue
    return datetime.now().astimezone().tzinfo or UTC


def parse_timestamp(text: str, *, tz: tzinfo | None = None) -> datetime | None:
    """A Slurm timestamp as a timezone-aware UTC datetime, or None for `Unknown` / `None` / empty.

    Epoch seconds (what `SLURM_TIME_FORMAT=%s` makes Slurm print; how `accounting` calls sacct) are
    exact. Slurm's standard format `YYYY-MM-DDTHH:MM:SS` is local wall time: it is read in `tz`
    (default `local_timezone()`) and converted; in a repeated DST hour the first occurrence is taken.
    Text with an explicit offset (ISO 8601) is honoured.
    """
    t = text.strip()
    if t.upper() in _NO_VALUE:
        return None
    if re.fullmatch(r"-?\d+", t):
        seconds = int(t)
        if seconds <= 0:
            return None
        return datetime.fromtimestamp(seconds, tz=UTC)
    if _ISO_LOCAL.match(t):
        naive = datetime.fromisoformat(t)
        return naive.replace(tzinfo=tz or local_timezone(), fold=0).astimezone(UTC)
    try:
        parsed = datetime.fromisoformat(t)
    except ValueError as exc:
        raise ValueError(f"not a Slurm timestamp: {text!r}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz or local_timezone())
    return parsed.astimezone(UTC)


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's ExitCode `CODE:SIGNAL` -> (exit status, signal); empty -> (None, None)."""
    t = text.strip()
    if not t:
        return None, None
    code, _, sig = t.partition(":")
    return int(code), (int(sig) if sig else 0)


def normalise_state(text: str) -> str:
    """Slurm's base state: `CANCELLED by 0` -> `CANCELLED`, `RUNNING+` -> `RUNNING`; upper case."""
    t = text.strip().split(" ", 1)[0].rstrip("+").upper()
    return t or "UNKNOWN"


def is_terminal(state: str) -> bool:
    """True when the (raw or normalised) state is final: the job will not run again."""
    return normalise_state(state) in TERMINAL_STATES


# ------------------------------------------------------------------------------------- accounting
@dataclass(frozen=True)
class AccountingRow:
    """One job (or one array task) as the scheduler's accounting records it.

    Timestamps are timezone-aware UTC (None before the event happened; for a job still pending, sacct
    may show the expected start as `start`). `timelimit_s` is `math.inf`
    for UNLIMITED. `timelimit` and `elapsed` keep Slurm's own text.
    """

    job_id: str
    job_name: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    state: str
    state_raw: str
    exit_code: int | None
    exit_signal: int | None
    node_list: str
    timelimit: str
    timelimit_s: float | None
    elapsed: str
    elapsed_s: float | None
    comment: str

    @property
    def array_job_id(self) -> str | None:
        """`5` for array task `5_1`; None for a job that is not an array task."""
        return self.job_id.split("_", 1)[0] if "_" in self.job_id else None

    @property
    def array_task_id(self) -> int | None:
        """`1` for array task `5_1`; None otherwise (or for a pending range like `5_[2-3]`)."""
        if "_" not in self.job_id:
            return None
        task = self.job_id.split("_", 1)[1]
        return int(task) if task.isdigit() else None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def settled(self) -> bool:
        """True when accounting holds the job's final record.

        slurmdbd fills a job's row from separate messages of the controller that can arrive in
        either order: the end message (final state, end time, comment) and the start message (time
        limit). A row can read COMPLETED with an empty Timelimit for about a second, or RUNNING with
        the limit but not yet the comment. Settled: a terminal state, an end time, and the time limit
        too unless the job never started.
        """
        return self.terminal and self.end is not None and (bool(self.timelimit) or self.start is None)


def _row_from_fields(fields: Sequence[str], tz: tzinfo | None) -> AccountingRow:
    (job_id, name, submit, start, end, state, exit_code, nodes, timelimit, elapsed, comment) = fields
    code, sig = parse_exit_code(exit_code)
    return AccountingRow(
        job_id=job_id.strip(),
        job_name=name,
        submit=parse_timestamp(submit, tz=tz),
        start=parse_timestamp(start, tz=tz),
        end=parse_timestamp(end, tz=tz),
        state=normalise_state(state),
        state_raw=state.strip(),
        exit_code=code,
        exit_signal=sig,
        node_list="" if nodes.strip() in ("None assigned", "(null)") else nodes.strip(),
        timelimit=timelimit.strip(),
        timelimit_s=parse_duration(timelimit),
        elapsed=elapsed.strip(),
        elapsed_s=parse_duration(elapsed),
        comment=comment,
    )


def parse_sacct(stdout: str, *, tz: tzinfo | None = None) -> list[AccountingRow]:
    """Rows of `sacct --parsable2 --noheader -X --format=<ACCOUNTING_FIELDS>`.

    A comment holding `|` stays whole (it is the last field); a comment holding a newline continues
    on the next output line, which is joined back.
    """
    n = len(ACCOUNTING_FIELDS)
    records: list[list[str]] = []
    for line in stdout.split("\n"):
        if not line and not records:
            continue
        parts = line.split("|", n - 1)
        if len(parts) == n and re.match(r"^\d+(?:_(?:\d+|\[.*\]))?(?:\+\d+)?$", parts[0].strip()):
            records.append(parts)
        elif records:
            records[-1][-1] += "\n" + line
        elif line.strip():
            raise ValueError(f"unexpected sacct output line: {line!r}")
    for rec in records:  # the output's final newline is not part of the last comment
        rec[-1] = rec[-1].rstrip("\n")
    return [_row_from_fields(rec, tz) for rec in records]


def _ids(job_ids: Iterable[int | str]) -> list[str]:
    out = [str(j).strip() for j in job_ids]
    for j in out:
        if not re.fullmatch(r"\d+(?:_\d+)?", j):
            raise ValueError(f"not a Slurm job id: {j!r}")
    return out


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
def time_left_s(job_id: int | str | None = None, *, runner: Runner | None = None) -> float | None:
    """Seconds the job has left before the scheduler's time limit, from `squeue -h -j ID -o %L`.

    `job_id` defaults to $SLURM_JOB_ID (inside a job). Returns `math.inf` when the job has no limit,
    0.0 when it is past its limit, None when no limit is set yet; see `parse_time_left`. The value is
    whole seconds (Slurm's resolution). Raises `JobNotFound` when the controller does not know the job.
    """
    if job_id is None:
        job_id = os.environ.get("SLURM_JOB_ID")
        if not job_id:
            raise SchedulerError("time_left_s() needs a job id outside a SLURM job (SLURM_JOB_ID is not set)")
    (jid,) = _ids([job_id])
    argv = ["squeue", "--noheader", f"--jobs={jid}", "--format=%L"]
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
    return parse_time_left(lines[0])


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
    if job_id is None:
        job_id = os.environ.get("SLURM_JOB_ID")
        if not job_id:
            raise SchedulerError("job_facts() needs a job id outside a SLURM job (SLURM_JOB_ID is not set)")
    (jid,) = _ids([job_id])
    argv = ["squeue", "--noheader", f"--jobs={jid}", "--format=%L|%l|%P|%N"]
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
    left, limit, partition, nodes = (lines[0].split("|") + ["", "", "", ""])[:4]
    return JobFacts(
        jid, parse_time_left(left), left.strip(), parse_duration(limit), limit.strip(), partition.strip(), nodes.strip()
    )


def parse_squeue_states(stdout: str) -> dict[str, str]:
    """`squeue -h -r -t all -o %i|%T` output -> {job id: normalised state}."""
    states: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        jid, _, state = line.partition("|")
        states[jid.strip()] = normalise_state(state)
    return states


def _covered(requested: str, found: Iterable[str]) -> bool:
    return any(f == requested or f.startswith(requested + "_") for f in found)


def job_states(job_ids: Iterable[int | str], *, runner: Runner | None = None) -> dict[str, str]:
    """Current state of each job, normalised (`PENDING`, `RUNNING`, `COMPLETED`, `CANCELLED`, ...).

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
    states: dict[str, str] = {}
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


# ----------------------------------------------------------------------------------------- export
EXPORT_COLUMNS: tuple[str, ...] = (
    "job_id",
    "job_name",
    "state",
    "state_raw",
    "exit_code",
    "exit_signal",
    "node_list",
    "timelimit",
    "timelimit_s",
    "elapsed",
    "elapsed_s",
    "comment",
    "submit_utc",
    "start_utc",
    "end_utc",
    "submit_local",
    "start_local",
    "end_local",
)


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt is not None else None


def _zone_name(tz: tzinfo) -> str:
    return getattr(tz, "key", None) or str(tz)


def _export_record(row: AccountingRow, tz: tzinfo) -> dict[str, object]:
    rec: dict[str, object] = {
        "job_id": row.job_id,
        "job_name": row.job_name,
        "state": row.state,
        "state_raw": row.state_raw,
        "exit_code": row.exit_code,
        "exit_signal": row.exit_signal,
        "node_list": row.node_list,
        "timelimit": row.timelimit,
        # JSON has no infinity: an unlimited job has timelimit "UNLIMITED" and timelimit_s null.
        "timelimit_s": None if row.timelimit_s is None or math.isinf(row.timelimit_s) else row.timelimit_s,
        "elapsed": row.elapsed,
        "elapsed_s": row.elapsed_s,
        "comment": row.comment,
    }
    for name in ("submit", "start", "end"):
        value: datetime | None = getattr(row, name)
        rec[f"{name}_utc"] = _iso(value)
        rec[f"{name}_local"] = _iso(value.astimezone(tz)) if value is not None else None
    return rec


def write_accounting_export(
    rows: Iterable[AccountingRow],
    path: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    local_tz: tzinfo | None = None,
) -> Path:
    """Write accounting rows as CSV or JSON (`fmt`, else from the suffix: `.csv`, `.json`).

    Every timestamp appears twice, ISO 8601 with its offset: `*_utc` (+00:00) and `*_local` in
    `local_tz` (default `local_timezone()`). JSON: {"source", "exported_at_utc", "local_tz",
    "columns", "rows": [...]}; CSV: a header of EXPORT_COLUMNS plus `local_tz`, empty cells for
    missing values. Returns the path.
    """
    out = Path(path)
    kind = (fmt or out.suffix.lstrip(".")).lower()
    if kind not in ("csv", "json"):
        raise ValueError(f"export format must be csv or json, not {kind!r} ({out})")
    tz = local_tz or local_timezone()
    zone = _zone_name(tz)
    records = [_export_record(r, tz) for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if kind == "json":
        doc = {
            "source": "sacct --parsable2 --noheader -X --format="
            + ",".join(ACCOUNTING_FIELDS)
            + " (SLURM_TIME_FORMAT=%s)",
            "exported_at_utc": datetime.now(UTC).isoformat(),
            "local_tz": zone,
            "columns": list(EXPORT_COLUMNS),
            "rows": records,
        }
        tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=[*EXPORT_COLUMNS, "local_tz"])
            writer.writeheader()
            for rec in records:
                writer.writerow({k: ("" if v is None else v) for k, v in {**rec, "local_tz": zone}.items()})
    os.replace(tmp, out)
    return out


def read_accounting_export(path: str | os.PathLike[str]) -> list[AccountingRow]:
    """Rows back from a file `write_accounting_export` wrote (CSV or JSON, by suffix)."""
    src = Path(path)
    if src.suffix.lower() == ".json":
        records: list[dict[str, object]] = json.loads(src.read_text(encoding="utf-8"))["rows"]
    else:
        with src.open(newline="", encoding="utf-8") as fh:
            records = [{k: (None if v == "" else v) for k, v in rec.items()} for rec in csv.DictReader(fh)]
    rows = []
    for rec in records:

        def ts(name: str) -> datetime | None:
            v = rec.get(f"{name}_utc")
            return datetime.fromisoformat(str(v)).astimezone(UTC) if v else None

        def num(name: str) -> float | None:
            v = rec.get(name)
            return float(v) if v is not None else None  # type: ignore[arg-type]

        def opt_int(name: str) -> int | None:
            v = rec.get(name)
            return int(v) if v is not None else None  # type: ignore[call-overload]

        timelimit = str(rec.get("timelimit") or "")
        rows.append(
            AccountingRow(
                job_id=str(rec["job_id"]),
                job_name=str(rec.get("job_name") or ""),
                submit=ts("submit"),
                start=ts("start"),
                end=ts("end"),
                state=str(rec["state"]),
                state_raw=str(rec.get("state_raw") or rec["state"]),
                exit_code=opt_int("exit_code"),
                exit_signal=opt_int("exit_signal"),
                node_list=str(rec.get("node_list") or ""),
                timelimit=timelimit,
                timelimit_s=math.inf if timelimit.upper() in _UNLIMITED else num("timelimit_s"),
                elapsed=str(rec.get("elapsed") or ""),
                elapsed_s=num("elapsed_s"),
                comment=str(rec.get("comment") or ""),
            )
        )
    return rows
