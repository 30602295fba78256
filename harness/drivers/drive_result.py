"""How a wall-time drive ended: its status, counts and timer lateness (harness/drivers/wall.py).

Kept apart from the driver so that what a run reports about its own drive (runs/realrun.py writes
DriveResult.summary() into meta.json; the client benchmark reads lateness) is a plain value with
no aiohttp or asyncio in it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.recording.schema import RunStatus


@dataclass
class DriveResult:
    """How a drive ended and what it cost; the per-turn truth is in the client's records."""

    status: RunStatus  # COMPLETED | INTERRUPTED | FAILED
    reason: str
    plan_time: float  # plan seconds from start to the end of the drive
    wall_seconds: float
    cpu_seconds: float  # this process, user + system, during the drive
    sent: int = 0
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    abandoned: int = 0  # in flight when the drive ended
    gauge_scrapes: int = 0
    gauge_failures: int = 0
    error_reasons: dict[str, int] = field(default_factory=dict)
    lateness: dict[str, np.ndarray] = field(default_factory=dict)  # timer tag -> wall seconds late

    @property
    def flagged(self) -> bool:
        """True when any turn failed: the run is usable only with its per-turn errors in view."""
        return self.errors > 0 or self.timeouts > 0

    def lateness_quantile(self, tag: str, q: float) -> float:
        arr = self.lateness.get(tag)
        return float(np.quantile(arr, q)) if arr is not None and arr.size else float("nan")

    def summary(self) -> dict[str, Any]:
        out = {
            k: getattr(self, k)
            for k in (
                "status",
                "reason",
                "plan_time",
                "wall_seconds",
                "cpu_seconds",
                "sent",
                "ok",
                "errors",
                "timeouts",
                "abandoned",
                "gauge_scrapes",
                "gauge_failures",
            )
        }
        out["flagged"] = self.flagged
        out["error_reasons"] = dict(self.error_reasons)
        out["lateness_p99_ms"] = {k: round(self.lateness_quantile(k, 0.99) * 1e3, 3) for k in self.lateness}
        out["lateness_max_ms"] = {
            k: round(float(v.max()) * 1e3, 3) if v.size else None for k, v in self.lateness.items()
        }
        return out


def timer_tag(key: Hashable) -> str:
    """The kind of a timer for lateness statistics: the first element of a tuple key."""
    if isinstance(key, tuple) and key:
        return str(key[0])
    return str(key)


def reason_class(reason: str) -> str:
    """Group error texts for the summary (the full text stays in each turn's row)."""
    if reason.startswith("connection"):
        return reason.split(":")[1].strip() if ":" in reason else "connection"
    if reason.startswith("no complete response"):
        return "timeout"
    return reason[:60]
