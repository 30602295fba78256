"""Closed-population client for the calibration stages (Stage C, E0a; paper App. E.3).

n sessions start together at t = 0 and each finished session is replaced at once by the next
session of the closed stream, so exactly n sessions are always in the system. Session i of the
closed stream is the same object at every n and on every engine (common random numbers), which
makes the curve μ(n) a comparison of engines and populations, not of draws.

Rows go to a sink with the run recorder's keyword methods (`turn`, `session`); without one the
client keeps them in a ListSink, which the calibration statistics read directly.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from harness.client.contract import Command, Send, Timer, TurnResponse
from harness.client.openloop import ListSink, RecordSink
from harness.client.session import Phase, SessionMachine
from harness.config import WorkloadConfig
from harness.workload.draws import STREAM_CLOSED, draw_session

_TOOL = "tool"


class ClosedClient:
    """Implements `harness.client.contract.Client` for a closed population of `n` sessions."""

    def __init__(
        self,
        workload: WorkloadConfig,
        n: int,
        *,
        seed: int = 0,
        sink: RecordSink | None = None,
        stop_replacing_at: float | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"population must be >= 1, got {n}")
        self.workload = workload
        self.n = n
        self.seed = seed
        self.sink: Any = sink if sink is not None else ListSink()
        self.stop_replacing_at = stop_replacing_at
        self.max_tokens = workload.decode_tokens
        self._machines: dict[int, SessionMachine] = {}
        self._started: dict[int, float] = {}
        self._inflight: dict[int, tuple[int, int, float]] = {}  # rid -> (sid, turn, send time)
        self._next_sid = 0
        self._next_rid = 0
        self.completed = 0

    # -- the Client contract ----------------------------------------------------------------------
    def start(self, now: float) -> Sequence[Command]:
        return [self._new_session(now) for _ in range(self.n)]

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        # The only timer this client sets is (_TOOL, session id): a tool call's end.
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == _TOOL and isinstance(key[1], int)):
            raise ValueError(f"unknown timer key {key!r}")
        return [self._send(now, self._machines[key[1]])]

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        sid, turn, send_time = self._inflight.pop(response.request_id)
        m = self._machines[sid]
        ok = response.status == "ok"
        outcome = m.on_output(response.output_ids, ok)
        extra = response.extra or {}
        self.sink.turn(
            session=sid,
            kind="closed",
            turn=turn,
            request_id=response.request_id,
            send_time=send_time,
            first_token_time=response.first_token_time,
            done_time=response.done_time,
            prompt_tokens=response.prompt_tokens,
            cached_tokens=response.cached_tokens,
            completion_tokens=response.completion_tokens,
            n_output_ids=None if response.output_ids is None else len(response.output_ids),
            queue_time=extra.get("queue_time"),
            engine_ttft=extra.get("engine_ttft"),
            engine_decode=extra.get("engine_decode"),
            status=response.status,
            http_status=response.http_status,
            error=response.error,
        )
        if not outcome.done:
            return [Timer(now + float(outcome.tool_time or 0.0), (_TOOL, sid))]
        self._end(now, sid, "completed" if m.phase is Phase.DONE else "failed")
        if self.stop_replacing_at is not None and now >= self.stop_replacing_at:
            return []
        return [self._new_session(now)]

    def finished(self) -> bool:
        return not self._machines

    def close(self, now: float) -> None:
        """Record sessions and requests still open when the driver stopped."""
        for rid, (sid, turn, send_time) in sorted(self._inflight.items()):
            self.sink.turn(
                session=sid,
                kind="closed",
                turn=turn,
                request_id=rid,
                send_time=send_time,
                done_time=None,
                status="unfinished",
            )
        for sid in sorted(self._machines):
            self._write_session(sid, "unfinished", None)

    # -- internals ---------------------------------------------------------------------------------
    def _new_session(self, now: float) -> Send:
        sid = self._next_sid
        self._next_sid += 1
        spec = draw_session(self.workload, self.seed, STREAM_CLOSED, sid)
        m = SessionMachine(sid, spec, self.workload)
        self._machines[sid] = m
        self._started[sid] = now
        return self._send(now, m)

    def _send(self, now: float, m: SessionMachine) -> Send:
        prompt = m.next_prompt()
        rid = self._next_rid
        self._next_rid += 1
        self._inflight[rid] = (m.sid, m.turn, now)
        return Send(rid, m.sid, m.turn, prompt, self.max_tokens)

    def _end(self, now: float, sid: int, outcome: str) -> None:
        self.completed += outcome == "completed"
        self._write_session(sid, outcome, now)
        del self._machines[sid]

    def _write_session(self, sid: int, outcome: str, end: float | None) -> None:
        m = self._machines[sid]
        start = self._started.pop(sid) if end is not None else self._started[sid]
        self.sink.session(
            session=sid,
            kind="closed",
            stream=STREAM_CLOSED,
            index=sid,
            arrival=start,
            admission=start,
            end=end,
            outcome=outcome,
            n_turns=m.n_turns,
            turns_done=m.turn if m.phase in (Phase.DONE, Phase.TOOL) else max(m.turn - 1, 0),
        )
