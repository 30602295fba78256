"""Client-side session gates: the CAPPED FIFO cap and the rescue gate (attrition and pause).

A gate decides when an arrived session may start and whether a session may go on after a tool
call. It holds no clock and does no I/O: the open-loop client tells it what happened and when, and
it answers with the sessions to start or resume now. Every decision is also appended to `events`
so a run records exactly when the gate engaged, held, paused, resumed and released sessions; the
mechanical checks of a rescue run (engage on time, release on the tick grid after the hold) read
those events, not the gate's internal state.

Slot semantics shared by both gates: a session holds its slot from admission to the end of its last
turn, tool calls included. A session waiting at the gate (or paused) is still "in the system".
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from harness.config import Gate

GateEventKind = Literal["engage", "queue", "admit", "pause", "resume", "release"]


@dataclass(frozen=True, slots=True)
class GateEvent:
    """One gate decision, with the occupancy right after it (for checks and plots)."""

    time: float
    kind: str
    session: int | None
    admitted: int
    queued: int
    paused: int


@dataclass(frozen=True, slots=True)
class Start:
    """A session the client must start (first turn) or resume (next turn) now."""

    session: int
    resumed: bool


class NoGate:
    """Every session starts on arrival and never pauses: the BURST / NOBURST arms."""

    kind = "none"

    def __init__(self) -> None:
        self.events: list[GateEvent] = []
        self.admitted: set[int] = set()

    # --- timers the client must schedule -------------------------------------------------
    def first_timer(self) -> float | None:
        """Time of the gate's first own timer (engage / release ticks), or None."""
        return None

    def on_timer(self, now: float) -> tuple[list[Start], float | None]:
        """The gate's timer fired: sessions to start now and the next timer time."""
        return [], None

    # --- session events ------------------------------------------------------------------
    def arrive(self, now: float, sid: int) -> list[Start]:
        self.admitted.add(sid)
        return [Start(sid, False)]

    def tool_end(self, now: float, sid: int) -> bool:
        """A tool call of an admitted session ended: True = send the next turn, False = paused."""
        return True

    def session_end(self, now: float, sid: int) -> list[Start]:
        self.admitted.discard(sid)
        return []

    # --- occupancy ------------------------------------------------------------------------
    @property
    def n_queued(self) -> int:
        return 0

    @property
    def n_paused(self) -> int:
        return 0

    @property
    def holding(self) -> bool:
        """True while the gate limits admissions (engaged and not released)."""
        return False


class _CapGate(NoGate):
    """Shared slot bookkeeping: FIFO arrival queue, optional resume queue served first."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        if cap < 1:
            raise ValueError(f"gate cap must be >= 1, got {cap}")
        self.cap = cap
        self.arrivals: deque[int] = deque()
        self.resumes: deque[int] = deque()

    @property
    def n_queued(self) -> int:
        return len(self.arrivals)

    @property
    def n_paused(self) -> int:
        return len(self.resumes)

    def _event(self, now: float, kind: GateEventKind, sid: int | None) -> None:
        self.events.append(GateEvent(now, kind, sid, len(self.admitted), len(self.arrivals), len(self.resumes)))

    def _fill(self, now: float) -> list[Start]:
        """Give free slots to paused sessions first, then to new arrivals, each FIFO."""
        out: list[Start] = []
        while len(self.admitted) < self.cap and (self.resumes or self.arrivals):
            if self.resumes:
                sid = self.resumes.popleft()
                self.admitted.add(sid)
                self._event(now, "resume", sid)
                out.append(Start(sid, True))
            else:
                sid = self.arrivals.popleft()
                self.admitted.add(sid)
                self._event(now, "admit", sid)
                out.append(Start(sid, False))
        return out

    def arrive(self, now: float, sid: int) -> list[Start]:
        if not self.holding:
            self.admitted.add(sid)
            return [Start(sid, False)]
        if len(self.admitted) < self.cap and not self.arrivals and not self.resumes:
            self.admitted.add(sid)
            self._event(now, "admit", sid)
            return [Start(sid, False)]
        self.arrivals.append(sid)
        self._event(now, "queue", sid)
        return []

    def session_end(self, now: float, sid: int) -> list[Start]:
        self.admitted.discard(sid)
        return self._fill(now) if self.holding else []


class FifoCapGate(_CapGate):
    """CAPPED: at most `cap` sessions admitted from t = 0; the rest wait in arrival order.

    Because a slot is held through tool calls, the engine never sees more than `cap` sessions'
    contexts competing for the pool, which is what keeps the good state's cache from thrashing.
    """

    kind = "fifo_cap"

    @property
    def holding(self) -> bool:
        return True


class RescueGate(_CapGate):
    """The rescue gate: engaged inside an established trap at `t_on`, by attrition and pause.

    Nobody is evicted at `t_on`. From then on a session whose tool call ends while more than `cap`
    sessions are admitted gives up its slot and joins the resume queue; free slots go to the resume
    queue before the arrival queue. The gate lifts itself at the first tick of the `tick` grid at or
    after `t_on + min_after` at which both queues have been empty for `hold` seconds, never earlier
    and never by force.
    """

    kind = "rescue"

    def __init__(
        self, cap: int, t_on: float, hold: float = 300.0, min_after: float = 600.0, tick: float = 10.0
    ) -> None:
        super().__init__(cap)
        if tick <= 0 or hold <= 0 or min_after < 0:
            raise ValueError(
                f"rescue gate: expected tick > 0, hold > 0 and min_after >= 0, "
                f"got tick {tick!r}, hold {hold!r}, min_after {min_after!r}"
            )
        self.t_on = t_on
        self.hold = hold
        self.min_after = min_after
        self.tick = tick
        self.engaged = False
        self.released = False
        self.release_time: float | None = None
        self.empty_since: float | None = None  # both queues empty since this time (while engaged)

    @property
    def holding(self) -> bool:
        return self.engaged and not self.released

    def first_timer(self) -> float | None:
        return self.t_on

    def first_tick(self) -> float:
        """First release tick: on the absolute `tick` grid, at or after t_on + min_after."""
        x = self.t_on + self.min_after
        k = math.ceil(x / self.tick - 1e-9)
        return k * self.tick

    def next_tick(self, now: float) -> float:
        """The first tick of the absolute grid strictly after `now`. A wall-clock driver fires a
        timer a little late; taking the next tick from the grid, not from `now + tick`, keeps that
        lateness from accumulating over the hundreds of ticks of a run."""
        k = math.floor(now / self.tick + 1e-9) + 1
        return k * self.tick

    def on_timer(self, now: float) -> tuple[list[Start], float | None]:
        if not self.engaged:
            self.engaged = True
            self.empty_since = now
            self._event(now, "engage", None)
            return self._fill(now), self.first_tick()
        if self.released:
            return [], None
        if self.release_due(now):
            self.released = True
            self.release_time = now
            self._event(now, "release", None)
            return [], None
        return [], self.next_tick(now)

    def release_due(self, now: float) -> bool:
        """The release test at a tick: late enough, queues empty, and empty for the whole hold."""
        if now < self.t_on + self.min_after - 1e-9:
            return False
        if self.arrivals or self.resumes or self.empty_since is None:
            return False
        return now - self.empty_since >= self.hold - 1e-9

    def _fill(self, now: float) -> list[Start]:
        out = super()._fill(now)
        if self.holding and not self.arrivals and not self.resumes and self.empty_since is None:
            self.empty_since = now
        return out

    def arrive(self, now: float, sid: int) -> list[Start]:
        out = super().arrive(now, sid)
        if self.arrivals:
            self.empty_since = None
        return out

    def tool_end(self, now: float, sid: int) -> bool:
        if not self.holding or len(self.admitted) <= self.cap:
            return True
        self.admitted.discard(sid)
        self.resumes.append(sid)
        self.empty_since = None
        self._event(now, "pause", sid)
        return False


def make_gate(spec: Gate | None, cap_override: int | None = None) -> NoGate:
    """Build the gate an arm asks for (`harness.config.Gate` or None); `cap_override` is the
    resolved cap (`ArmConfig.gate_cap(test.cap)`), which wins over the arm file's own."""
    if spec is None:
        return NoGate()
    kind = spec.kind
    cap = cap_override if cap_override is not None else spec.cap
    if cap is None:
        raise ValueError(f"{kind} gate without a cap: give the arm a cap or the test a registered cap")
    cap = int(cap)
    if kind == "fifo_cap":
        return FifoCapGate(cap)
    if kind == "rescue":
        return RescueGate(
            cap,
            float(spec.t_on),
            hold=float(spec.release_hold),
            min_after=float(spec.release_min_after),
            tick=float(spec.release_tick),
        )
    raise ValueError(f"unknown gate kind {kind!r}")
