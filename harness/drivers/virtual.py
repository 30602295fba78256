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
"""

from __future__ import annotations

import heapq
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.client.contract import Client, Command, Send, Timer, TurnResponse
from harness.refengine.model import BaseEngine, EngineRequest

_ENGINE, _TIMER, _GAUGE = 0, 1, 2


@dataclass
class SimResult:
    """How a simulation ended and what it cost; the per-turn truth is in the client's records."""

    status: str  # COMPLETED (client finished) | HORIZON (reached `until`)
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


def _gauge_writer(recorder: Any) -> Callable[[float, dict[str, float]], None] | None:
    if recorder is None or not hasattr(recorder, "gauge"):
        return None
    params = set(inspect.signature(recorder.gauge).parameters)

    def write(t: float, values: dict[str, float]) -> None:
        recorder.gauge(time=t, **{k: v for k, v in values.items() if k in params and k != "time"})

    return write


def simulate(
    client: Client,
    engine: BaseEngine,
    *,
    recorder: Any = None,
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
    wall0 = time.perf_counter()
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0
    sent_at: dict[int, float] = {}
    res = SimResult(status="COMPLETED", end_time=0.0, wall_seconds=0.0)
    write_gauge = _gauge_writer(recorder)
    gauges_on = bool(gauge_interval) and (write_gauge is not None or on_gauge is not None)
    horizon_end = math.inf if until is None else until
    push = heapq.heappush
    pop = heapq.heappop

    def apply(now: float, cmds: Sequence[Command]) -> None:
        nonlocal seq
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
                    work.extend(client.on_response(now, r))
                    continue
                sent_at[c.request_id] = now
            elif isinstance(c, Timer):
                seq += 1
                push(heap, (c.at if c.at > now else now, seq, _TIMER, c.key))
            else:
                raise TypeError(f"unknown client command {c!r}")

    now = 0.0
    apply(now, client.start(now))
    if gauges_on:
        seq += 1
        push(heap, (0.0, seq, _GAUGE, 0))

    def kick(now: float) -> None:
        nonlocal seq
        if engine.busy or not engine.has_work():
            return
        horizon = heap[0][0] if heap else horizon_end
        end = engine.step(now, horizon if horizon < horizon_end else horizon_end)
        if end is not None:
            res.iterations += 1
            seq += 1
            push(heap, (end, seq, _ENGINE, None))

    kick(now)
    while heap:
        t = heap[0][0]
        if t > horizon_end:
            now = horizon_end
            res.status = "HORIZON"
            break
        now = t
        while heap and heap[0][0] == now:
            _, _, kind, payload = pop(heap)
            res.events += 1
            if kind == _ENGINE:
                for c in engine.complete(now):
                    res.ok += 1
                    r = TurnResponse(
                        c.req_id,
                        "ok",
                        sent_at.pop(c.req_id, c.submit_time),
                        now,
                        first_token_time=c.first_token_time,
                        output_ids=c.output_ids,
                        prompt_tokens=c.prompt_tokens,
                        cached_tokens=c.cached_tokens,
                        completion_tokens=c.completion_tokens,
                        http_status=200,
                        extra=_engine_timings(c),
                    )
                    apply(now, client.on_response(now, r))
            elif kind == _TIMER:
                apply(now, client.on_timer(now, payload))
            else:
                values = engine.gauges()
                if write_gauge is not None:
                    write_gauge(now, values)
                if on_gauge is not None:
                    on_gauge(now, values)
                seq += 1
                push(heap, ((payload + 1) * gauge_interval, seq, _GAUGE, payload + 1))  # type: ignore[operator]
        if client.finished() and not engine.has_work() and not engine.busy:
            break
        kick(now)
    if res.status == "COMPLETED" and not client.finished():
        # Nothing is pending, yet the client still expects something: with a horizon the run simply
        # idles to it; without one it would never end, which is a client or engine-model bug.
        if until is None:
            raise RuntimeError(
                f"simulation stalled at t = {now:g} s: the client is not finished but no event is pending "
                f"(engine: {len(engine.waiting)} waiting, {len(engine.running)} running)"
            )
        now = until
        res.status = "HORIZON"
    res.end_time = now
    res.in_flight = len(sent_at)
    close: Callable[[float], None] | None = getattr(client, "close", None)
    if close is not None:
        close(now)
    res.wall_seconds = time.perf_counter() - wall0
    return res


__all__ = ["SimResult", "simulate"]


def _engine_timings(c: Any) -> dict[str, float]:
    """The engine model's own per-request timings, in the fields a real vLLM reports them."""
    a = getattr(c, "admit_time", float("nan"))
    if a != a:  # nan: unknown
        return {}
    return {
        "queue_time": a - c.submit_time,
        "engine_ttft": c.first_token_time - a,
        "engine_decode": c.done_time - c.first_token_time,
    }
