"""How long a registered job needs, and the time limit it is submitted with.

One formula serves both ends, so the submission and the job can never disagree about it (rules
digest, Decision 16; paper App. E.11, the pre-run time check): a run needs its protocol's duration
divided by the time scale (plan seconds per wall second: 1 on a real engine, the emulator's
`--time-scale` otherwise), plus the registration's allowances for starting the engine, the Stage 0
smoke test with the flush + canary, and the teardown. The simulator runs in virtual time, so its
run term is zero and only the allowances count.

The job refuses when the scheduler's time left (`squeue -o %L`) is shorter than that, plus the lead
of the scheduler's warning signal it was submitted with (the job ends INTERRUPTED when the warning
arrives, so a run must be done before it). The submission asks for the need, the warning lead, the
scheduler's slack in sending signals and enforcing limits (about a minute: limits are checked about
every 30 s and a signal may come that much early), and a proportional margin, in whole minutes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from slurm.parsers import parse_duration

#: Plan seconds per wall second when the engine is real (it runs on its own clock).
REAL_TIME_SCALE = 1.0
#: Seconds by which Slurm may send a --signal early or enforce a limit late (checks every ~30 s).
SCHEDULER_SLACK_S = 60.0
#: Default lead of the warning signal before the limit, capped at a quarter of the limit.
WARNING_LEAD_S = 60.0
#: Proportional margin on the need, for engines slower than the allowances assume.
MARGIN_FRACTION = 0.10
#: Shortest limit asked for: Slurm limits are whole minutes, and a 1-minute job leaves no lead.
MIN_LIMIT_MIN = 2


@dataclass(frozen=True)
class Budget:
    """What one job needs, in seconds, and how it was computed."""

    engine: str
    duration_s: float  # the protocol's duration, plan seconds
    time_scale: float | None  # None: virtual time (the simulator)
    run_s: float  # wall seconds of the run itself
    start_s: float
    smoke_s: float
    teardown_s: float

    @property
    def needed_s(self) -> float:
        return self.run_s + self.start_s + self.smoke_s + self.teardown_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "needed_s": self.needed_s}


def time_scale_for(engine: str, time_scale: float | None) -> float | None:
    """The time scale a run of `engine` runs at: None for the simulator, 1 for a real engine, the
    given scale for the emulator (which is the only engine that runs faster than real time)."""
    kind = engine.partition(":")[0]
    if kind == "sim":
        return None
    if kind == "emulator":
        scale = float(time_scale if time_scale is not None else 1.0)
        if not scale > 0:
            raise ValueError(f"time scale must be positive, got {time_scale!r}")
        return scale
    if time_scale not in (None, 1, 1.0):
        raise ValueError(f"--time-scale {time_scale} is for the emulator only; engine {engine!r} runs in real time")
    return REAL_TIME_SCALE


def run_budget(duration_s: float, allowances: Any, engine: str, time_scale: float | None) -> Budget:
    """The need of one run of `duration_s` plan seconds under the registration's `allowances`
    (an object or mapping with start_s, smoke_s, teardown_s)."""
    # A mapping without one of the keys fails on its name (KeyError), not on float(None).
    get = allowances.__getitem__ if isinstance(allowances, dict) else lambda k: getattr(allowances, k)
    scale = time_scale_for(engine, time_scale)
    run_s = 0.0 if scale is None else float(duration_s) / scale
    return Budget(
        engine, float(duration_s), scale, run_s, float(get("start_s")), float(get("smoke_s")), float(get("teardown_s"))
    )


def warning_lead_s(limit_s: float, lead_s: float = WARNING_LEAD_S) -> int:
    """The warning signal's lead for a job of `limit_s`: at most a quarter of the limit, at least 1 s."""
    return int(max(1, min(lead_s, limit_s / 4)))


@dataclass(frozen=True)
class TimeLimit:
    """The per-job limit of a submission: `minutes` is what sbatch gets (`--time`)."""

    minutes: int
    warning_lead_s: int
    needed_s: float
    source: str  # "protocol" (computed) or "--time" (given)
    fits: bool  # the limit leaves the need plus the lead: the job's time check can pass

    @property
    def seconds(self) -> float:
        return 60.0 * self.minutes

    @property
    def slurm(self) -> str:
        """HH:MM:SS (D-HH:MM:SS past a day), as sacct prints Timelimit."""
        d, rem = divmod(self.minutes * 60, 86400)
        h, rem = divmod(rem, 3600)
        m = rem // 60
        return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:00"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds, "slurm": self.slurm}


def job_time_limit(
    budget: Budget, given_minutes: int | None = None, *, lead_s: float = WARNING_LEAD_S, margin: float = MARGIN_FRACTION
) -> TimeLimit:
    """The limit to submit with: `given_minutes` (the user's --time) if any, else the need plus the
    warning lead, the scheduler's slack and the margin, rounded up to whole minutes."""
    need = budget.needed_s
    if given_minutes is not None:
        if given_minutes < 1:
            raise ValueError(f"--time {given_minutes}: expected at least 1 minute")
        lead = warning_lead_s(60.0 * given_minutes, lead_s)
        return TimeLimit(int(given_minutes), lead, need, "--time", 60.0 * given_minutes >= need + lead)
    want = need * (1.0 + margin) + lead_s + SCHEDULER_SLACK_S
    minutes = max(MIN_LIMIT_MIN, math.ceil(want / 60.0))
    lead = warning_lead_s(60.0 * minutes, lead_s)
    return TimeLimit(minutes, lead, need, "protocol", 60.0 * minutes >= need + lead)


def parse_time_minutes(text: str) -> int:
    """`--time` as sbatch reads it (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole
    minutes, rounded up as Slurm does."""
    try:
        secs = parse_duration(text)
    except ValueError:
        raise ValueError(
            f"--time {text!r}: expected minutes or a Slurm duration such as 90, 1:30:00 or 1-00:00"
        ) from None
    if secs is None or math.isinf(secs):
        raise ValueError(f"--time {text!r}: expected a finite limit")
    return max(1, math.ceil(secs / 60.0))
