"""The virtual-time driver: plays any sans-IO Client against the engine model with an event heap.

It does for virtual time what harness/drivers/wall.py does for wall time. Events are plain tuples
(time, seq, kind, payload) on one heap; `seq` breaks ties in push order, so a run is a pure
function of the client, the engine and their seeds. All events due at the same instant are
handled before the engine plans its next iteration, so simultaneous sends are batched the same way
whatever their order in the heap.

The engine is told the time of the next pending event when it plans an iteration (`horizon`), so
it can fuse decode-only iterations that no event can interrupt; only engine completions, client
timers and gauge samples are events. Requests the engine refuses (prompt too long) come back to
the client at once as errors with HTTP status 400, as from a real server.

Shape (Vidur's): a `Simulator` is an event loop over plain entities (the client, the engine model,
the heap of events, the counters of a `SimResult`); one method per kind of event. `simulate` builds
one and runs it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from harness.client.contract import Client, Command, Send, Timer, TurnResponse
from harness.drivers.sinks import GaugeRecorder, write_gauge
from harness.refengine.model import BaseEngine, EngineCompletion, EngineRequest

_ENGINE, _TIMER, _GAUGE, _RESPONSE = 0, 1, 2, 3

#: One event: (virtual time, push order, kind, payload: a timer's key or a gauge tick's index).
Event = tuple[float, int, int, Any]


class SimEnd(StrEnum):
    """How a simulation ended (the `simulation.status` a sim run's meta.json records)."""

    COMPLETED = "COMPLETED"  # the client finished and the engine is idle
    HORIZON = "HORIZON"  # virtual time reached `until`


@dataclass
class SimResult:
    """How a simulation ended and what it cost; the per-turn truth is in the client's records."""

    status: SimEnd
    end_time: float  # virtual seconds
    wall_seconds: float
    events: int = 0
    iterations: int = 0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    in_flight: int = 0  # requests inside the engine when the run ended

    @property
    def speed(self) -> float:
        """Simulated seconds per wall second."""
        return self.end_time / self.wall_seconds if self.wall_seconds > 0 else math.inf

    def as_meta(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("status", "end_time", "wall_seconds", "events", "iterations", "sent", "ok", "errors", "in_flight")
        }


class Simulator:
    """One simulation run: the client and the engine model, the event heap, and the counters.

    Events are engine completions (the end of the iteration the engine planned), client timers and
    gauge ticks. Every event due at one instant is handled before the engine plans its next
    iteration (`_kick`), so simultaneous sends are batched alike whatever their heap order."""

    def __init__(
        self,
        client: Client,
        engine: BaseEngine,
        *,
        recorder: GaugeRecorder | None = None,
        until: float | None = None,
        gauge_interval: float | None = 5.0,
        on_gauge: Callable[[float, dict[str, float]], None] | None = None,
    ) -> None:
        self.client = client
        self.engine = engine
        self.recorder = recorder
        self.on_gauge = on_gauge
        self.until = until
        self.horizon_end = math.inf if until is None else until
        self.gauge_interval = gauge_interval or 0.0
        self.gauges_on = bool(gauge_interval) and (recorder is not None or on_gauge is not None)
        self.heap: list[Event] = []
        self.seq = 0
        self.sent_at: dict[int, float] = {}  # request id -> when it was sent, while in the engine
        self.now = 0.0
        self.res = SimResult(status=SimEnd.COMPLETED, end_time=0.0, wall_seconds=0.0)

    # ------------------------------------------------------------------ the loop
    def run(self) -> SimResult:
        """From t = 0 until the client is finished and the engine idle, or `until`."""
        wall0 = time.perf_counter()
        heap, res, engine, client = self.heap, self.res, self.engine, self.client
        horizon_end = self.horizon_end
        pop = heapq.heappop
        self._apply(client.start(0.0))
        if self.gauges_on:
            self._push(0.0, _GAUGE, 0)
        self._kick()
        events = 0
        while heap:
            t = heap[0][0]
            if t > horizon_end:
                self.now = horizon_end
                res.status = SimEnd.HORIZON
                break
            self.now = now = t
            while heap and heap[0][0] == now:
                _, _, kind, payload = pop(heap)
                events += 1
                if kind == _ENGINE:
                    self._on_engine(now)
                elif kind == _TIMER:
                    self._apply(client.on_timer(now, payload))
                elif kind == _RESPONSE:
                    self._respond(now, payload)
                else:
                    self._on_gauge(now, payload)
            # the run ends when the client is finished and the engine idle, else a free engine with
            # work plans its next iteration (_kick, with its checks read once for both)
            if not engine.busy:
                if engine.has_work():
                    self._plan_next()
                elif client.finished():
                    break
        res.events += events
        self._end()
        res.wall_seconds = time.perf_counter() - wall0
        return res

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def _kick(self) -> None:
        """Let the engine plan its next iteration (told the next event's time) if it is free."""
        engine = self.engine
        if engine.busy or not engine.has_work():
            return
        self._plan_next()

    def _plan_next(self) -> None:
        """`_kick` for an engine known to be free and to have work."""
        heap, horizon_end = self.heap, self.horizon_end
        horizon = heap[0][0] if heap else horizon_end
        end = self.engine.step(self.now, horizon if horizon < horizon_end else horizon_end)
        if end is not None:
            self.res.iterations += 1
            self.seq += 1  # _push, written out: the loop's most frequent event
            heapq.heappush(heap, (end, self.seq, _ENGINE, None))

    # ------------------------------------------------------------------ events
    def _apply(self, cmds: Sequence[Command]) -> None:
        """Carry out the client's commands at the current time; a refusal answers at once."""
        now, res, engine = self.now, self.res, self.engine
        work = list(cmds)
        while work:
            c = work.pop(0)
            if isinstance(c, Send):
                res.sent += 1
                try:
                    engine.submit(EngineRequest(c.request_id, c.prompt, c.max_tokens), now)
                except ValueError as exc:
                    res.errors += 1
                    r = TurnResponse(c.request_id, "error", now, now, http_status=400, error=str(exc))
                    work.extend(self.client.on_response(now, r))
                    continue
                self.sent_at[c.request_id] = now
            elif isinstance(c, Timer):
                self._push(c.at if c.at > now else now, _TIMER, c.key)
            else:
                raise TypeError(f"unknown client command {c!r}")

    def _on_engine(self, now: float) -> None:
        """The engine's iteration ended: each finished request goes back to the client (after the
        cost's response delay d_r, if it has one: the server's path out, which takes no engine time)."""
        delay = self.engine.cost.d_r
        for c in self.engine.complete(now):
            if delay > 0:
                self._push(now + delay, _RESPONSE, c)
            else:
                self._respond(now, c)

    def _respond(self, now: float, c: EngineCompletion) -> None:
        """A finished request's response reaches the client at `now`."""
        self.res.ok += 1
        r = TurnResponse(
            c.req_id,
            "ok",
            self.sent_at.pop(c.req_id, c.submit_time),
            now,
            first_token_time=c.first_token_time,
            output_ids=c.output_ids,
            prompt_tokens=c.prompt_tokens,
            cached_tokens=c.cached_tokens,
            completion_tokens=c.completion_tokens,
            http_status=200,
            extra=_engine_timings(c),
        )
        self._apply(self.client.on_response(now, r))

    def _on_gauge(self, now: float, tick: int) -> None:
        values = self.engine.gauges()
        if self.recorder is not None:
            write_gauge(self.recorder, now, values)
        if self.on_gauge is not None:
            self.on_gauge(now, values)
        self._push((tick + 1) * self.gauge_interval, _GAUGE, tick + 1)

    def _end(self) -> None:
        """Settle how the run ended and let the client record what is still open."""
        res, client = self.res, self.client
        if res.status == SimEnd.COMPLETED and not client.finished():
            # Nothing is pending, yet the client still expects something: with a horizon the run
            # simply idles to it; without one it would never end, which is a client or engine-model bug.
            if self.until is None:
                raise RuntimeError(
                    f"simulation stalled at t = {self.now:g} s: the client is not finished but no event is pending "
                    f"(engine: {len(self.engine.waiting)} waiting, {len(self.engine.running)} running)"
                )
            self.now = self.until
            res.status = SimEnd.HORIZON
        res.end_time = self.now
        res.in_flight = len(self.sent_at)
        close: Callable[[float], None] | None = getattr(client, "close", None)
        if close is not None:
            close(self.now)


def simulate(
    client: Client,
    engine: BaseEngine,
    *,
    recorder: GaugeRecorder | None = None,
    until: float | None = None,
    gauge_interval: float | None = 5.0,
    on_gauge: Callable[[float, dict[str, float]], None] | None = None,
) -> SimResult:
    """Run `client` against `engine` from t = 0 until the client is finished (and the engine idle)
    or virtual time `until`, whichever comes first.

    Gauge samples (engine.gauges() every `gauge_interval` virtual seconds, starting at 0) go to
    `recorder.gauge(time=..., ...)` and/or `on_gauge(t, values)`. Clients with a `close(now)`
    method are closed at the end so they can record what is still open.
    """
    sim = Simulator(client, engine, recorder=recorder, until=until, gauge_interval=gauge_interval, on_gauge=on_gauge)
    return sim.run()


__all__ = ["SimEnd", "SimResult", "Simulator", "simulate"]


def _engine_timings(c: EngineCompletion) -> dict[str, float]:
    """The engine model's own per-request timings, in the fields a real vLLM reports them."""
    a = getattr(c, "admit_time", float("nan"))
    if a != a:  # nan: unknown
        return {}
    return {
        "queue_time": a - c.submit_time,
        "engine_ttft": c.first_token_time - a,
        "engine_decode": c.done_time - c.first_token_time,
    }
