"""What Slurm's commands print, read into typed values: job states, durations, timestamps, exit
codes, and `sacct`'s accounting rows.

Why apart from the commands (slurm/scheduler.py) and the export (slurm/accounting_export.py): these
are pure functions of text, used on a live answer, on a capture in a test, and on an export read
back, so they need neither a cluster nor a file.

Times. `sacct` prints timestamps in the local time of the machine it runs on, without a zone
(`2026-12-01T06:19:07`), which is ambiguous in the hour a DST change repeats. The commands avoid the
problem at the source: every `sacct` call runs with `SLURM_TIME_FORMAT=%s`, which makes Slurm format
its timestamps with strftime's `%s`, seconds since the Unix epoch, a zone-free instant. Those are
turned into timezone-aware UTC datetimes. When given text in Slurm's standard format anyway (logs,
another tool's capture), `parse_timestamp` reads it as wall time in an explicit zone (`tz`, default
the machine's zone, see `local_timezone`) and converts it to UTC.

Malformed text raises ValueError with the text.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "ACCOUNTING_FIELDS",
    "PENDING_STATES",
    "RUNNING_STATES",
    "TERMINAL_STATES",
    "AccountingRow",
    "JobState",
    "is_terminal",
    "local_timezone",
    "normalise_state",
    "parse_duration",
    "parse_exit_code",
    "parse_sacct",
    "parse_squeue_states",
    "parse_time_left",
    "parse_timestamp",
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


class JobState(StrEnum):
    """A job's base state, in Slurm's own words (`squeue %T`, `sacct State`), the strings written
    into the accounting export, the manifest and collection.json. The local executor names its
    processes' states with the same words, so one reader serves both."""

    # waiting to start
    PENDING = "PENDING"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SPECIAL_EXIT = "SPECIAL_EXIT"  # requeued in a held state; also final for the run that ended so
    # started and not ended
    RUNNING = "RUNNING"
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    STAGE_OUT = "STAGE_OUT"
    SIGNALING = "SIGNALING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    RESIZING = "RESIZING"
    # ended
    COMPLETED = "COMPLETED"
    BOOT_FAIL = "BOOT_FAIL"
    CANCELLED = "CANCELLED"
    DEADLINE = "DEADLINE"
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    REVOKED = "REVOKED"
    TIMEOUT = "TIMEOUT"
    # ours: no state known (no answer, empty text, or a name this list lacks)
    UNKNOWN = "UNKNOWN"


#: States after which a job never runs again (Slurm's base job states).
TERMINAL_STATES: frozenset[JobState] = frozenset(
    {
        JobState.BOOT_FAIL,
        JobState.CANCELLED,
        JobState.COMPLETED,
        JobState.DEADLINE,
        JobState.FAILED,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
        JobState.PREEMPTED,
        JobState.REVOKED,
        JobState.SPECIAL_EXIT,
        JobState.TIMEOUT,
    }
)
#: States of a job waiting to start (or to start again).
PENDING_STATES: frozenset[JobState] = frozenset(
    {
        JobState.PENDING,
        JobState.REQUEUED,
        JobState.REQUEUE_FED,
        JobState.REQUEUE_HOLD,
        JobState.RESV_DEL_HOLD,
        JobState.SPECIAL_EXIT,
    }
)
#: States of a job that started and has not ended.
RUNNING_STATES: frozenset[JobState] = frozenset(
    {
        JobState.RUNNING,
        JobState.CONFIGURING,
        JobState.COMPLETING,
        JobState.STAGE_OUT,
        JobState.SIGNALING,
        JobState.SUSPENDED,
        JobState.STOPPED,
        JobState.RESIZING,
    }
)

# Text Slurm prints for "no value" in time and duration columns.
_NO_VALUE = frozenset({"", "NONE", "UNKNOWN", "N/A", "NOT_SET", "PARTITION_LIMIT", "INVALID"})
#: Text Slurm prints for no time limit.
UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "-1"})
_DURATION = re.compile(
    r"""^(?:(?P<days>\d+)-)?            # D-
        (?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+(?:\.\d+)?))?$""",
    re.X,
)
_DURATION_MS = re.compile(r"^(?P<m>\d+):(?P<s>\d+\.\d+)$")  # sacct's MM:SS.mmm (CPU times)
_ISO_LOCAL = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")


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
    if up in UNLIMITED:
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
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text().strip())
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


def normalise_state(text: str) -> JobState:
    """Slurm's base state: `CANCELLED by 0` -> CANCELLED, `RUNNING+` -> RUNNING; upper case.

    The one place a state Slurm printed becomes a `JobState`: empty text, and a name this list does
    not know, read as UNKNOWN (an accounting row keeps the text as printed in `state_raw`)."""
    t = text.strip().split(" ", 1)[0].rstrip("+").upper()
    try:
        return JobState(t)
    except ValueError:
        return JobState.UNKNOWN


def is_terminal(state: str) -> bool:
    """True when the (raw or normalised) state is final: the job will not run again."""
    return normalise_state(state) in TERMINAL_STATES


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
    state: JobState
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


def parse_squeue_states(stdout: str) -> dict[str, JobState]:
    """`squeue -h -r -t all -o %i|%T` output -> {job id: normalised state}."""
    states: dict[str, JobState] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        jid, _, state = line.partition("|")
        states[jid.strip()] = normalise_state(state)
    return states
