"""The open-loop plan player: plays a frozen arrival plan against any driver.

Open loop is the point of the experiment: sessions arrive at the plan's times whatever the server
is doing, so a slow server lengthens the queue instead of slowing the arrivals (a closed-loop load
generator would hide the trap by backing off). Each session walks its SessionMachine; an optional
gate (CAPPED, rescue) sits between arrival and the first turn and between a tool call and the next
turn. TOOLSLOW is applied here, at the moment a tool call starts, because it is a rule about time,
not about the plan's draws; SHED refusals are already flagged in the plan and are only recorded.

The client writes one row per turn and one per session to a sink (the run recorder, or a list in
tests) and keeps the requests in flight, so the analysis can rebuild the outstanding backlog.

Two delays sit between a session's planned arrival and its first turn, and they are recorded apart
because they mean different things. *Start lateness* is the client's own: a wall-clock driver may
run an arrival timer late when the client and the engine share the CPU, which is a departure from
open loop (the run's validity question). *Gate wait* is the experiment's: the time a gate (CAPPED,
rescue) held the session once the client had it. Without a gate the gate wait is exactly zero,
however late the client was.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.client.contract import Command, Send, Timer, TurnResponse
from harness.client.gates import GateEvent, NoGate, Start, make_gate
from harness.client.session import Phase, SessionMachine
from harness.config import ArmConfig, WorkloadConfig
from harness.workload.draws import SessionSpec

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class ToolSlowRule:
    """A tool call that starts in [start, end) lasts `delta` seconds longer."""

    start: float
    end: float
    delta: float

    def extra(self, t: float) -> float:
        return self.delta if self.start <= t < self.end else 0.0


class RecordSink(Protocol):
    """Where rows go: `harness.recording.record.RunRecorder`, or anything with the same keyword methods.

    The signatures are the recorder's (the run record's columns), so a client writing a field the
    record has not got, or leaving out one it needs, fails the type check; ListSink takes any row.
    """

    def turn(
        self,
        *,
        session: int,
        kind: str,
        turn: int,
        send_time: float,
        done_time: float | None,
        status: str = ...,
        first_token_time: float | None = ...,
        prompt_tokens: int | None = ...,
        cached_tokens: int | None = ...,
        completion_tokens: int | None = ...,
        n_output_ids: int | None = ...,
        queue_time: float | None = ...,
        engine_ttft: float | None = ...,
        engine_decode: float | None = ...,
        http_status: int | None = ...,
        error: str | None = ...,
        request_id: int | None = ...,
    ) -> None: ...

    def session(
        self,
        *,
        session: int,
        kind: str,
        arrival: float,
        outcome: str,
        stream: int | None = ...,
        index: int | None = ...,
        admission: float | None = ...,
        end: float | None = ...,
        n_turns: int | None = ...,
        turns_done: int | None = ...,
        start_lateness: float | None = ...,
        gate_wait: float | None = ...,
        paused_time: float | None = ...,
    ) -> None: ...

    def gate_event(
        self,
        *,
        time: float,
        event: str,
        session: int | None = ...,
        queue_new: int | None = ...,
        queue_resume: int | None = ...,
        admitted: int | None = ...,
        cap: int | None = ...,
    ) -> None: ...


class ListSink:
    """Collects rows as dicts; for tests and for runs analysed in memory. Session rows are
    re-written as a session progresses; `final_sessions()` keeps each session's last row."""

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []
        self.session_rows: list[dict[str, Any]] = []
        self.gate_events: list[dict[str, Any]] = []

    def turn(self, **row: Any) -> None:
        self.turns.append(row)

    def session(self, **row: Any) -> None:
        self.session_rows.append(row)

    def gate_event(self, **row: Any) -> None:
        self.gate_events.append(row)

    @property
    def sessions(self) -> list[dict[str, Any]]:
        last: dict[int, dict[str, Any]] = {}
        for r in self.session_rows:
            last.pop(r["session"], None)
            last[r["session"]] = r
        return list(last.values())


@dataclass(slots=True)
class _SessionState:
    sid: int
    spec: SessionSpec
    machine: SessionMachine | None = None
    arrived: bool = False
    seen: float = NAN  # when the client played the arrival (planned arrival + start lateness)
    admission: float = NAN
    end: float = NAN
    outcome: str = ""
    turns_done: int = 0
    n_pauses: int = 0
    pause_time: float = 0.0
    paused_at: float | None = None
    n_slowed: int = 0
    tool_pending: bool = False


@dataclass(slots=True)
class _InFlight:
    sid: int
    turn: int
    prompt_len: int
    send_time: float


_ARRIVE = "arrive"
_TOOL = "tool"
_GATE = "gate"


class PlanClient:
    """Plays a plan's sessions open-loop; implements `harness.client.contract.Client`.

    Session id i is the plan's row i (`Plan.sessions[i]`); its kind and SHED flag come from the
    spec. Rows need not be sorted; they are played in (arrival, id) order. `close(now)` must be
    called once the driver stops, so that sessions and requests still open at the end of the run
    are recorded (a trapped run ends with hundreds of both, and the outstanding backlog counts them).
    """

    def __init__(
        self,
        sessions: Sequence[SessionSpec],
        workload: WorkloadConfig,
        *,
        gate: NoGate | None = None,
        toolslow: ToolSlowRule | None = None,
        sink: RecordSink | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.workload = workload
        self.gate = gate if gate is not None else NoGate()
        self.toolslow = toolslow
        self.sink: RecordSink = sink if sink is not None else ListSink()
        self.max_tokens = int(max_tokens if max_tokens is not None else workload.decode_tokens)
        order = sorted(range(len(sessions)), key=lambda i: (sessions[i].arrival, i))
        self._state: list[_SessionState] = [_SessionState(i, spec) for i, spec in enumerate(sessions)]
        self._order: list[_SessionState] = [self._state[i] for i in order]
        self._next_arrival = 0
        self._inflight: dict[int, _InFlight] = {}
        self._next_rid = 0
        self._open = 0  # arrived, admitted-or-held, not ended
        self._gate_flushed = 0
        self._closed = False
        self.tool_calls_slowed = 0
        self.prompt_mismatches = 0  # client prompt length != server-reported prompt tokens
        self._lateness: list[tuple[str, float]] = []  # (kind, start lateness) of every arrival played

    # ------------------------------------------------------------------ the Client contract
    def start(self, now: float) -> Sequence[Command]:
        cmds: list[Command] = []
        self._schedule_arrival(cmds)
        t = self.gate.first_timer()
        if t is not None:
            cmds.append(Timer(max(t, now), (_GATE,)))
        return cmds

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        cmds: list[Command] = []
        tag = key[0]  # type: ignore[index]
        if tag == _ARRIVE:
            self._arrivals(now, cmds)
        elif tag == _TOOL:
            self._tool_end(now, key[1], cmds)  # type: ignore[index]
        elif tag == _GATE:
            starts, nxt = self.gate.on_timer(now)
            self._start_all(now, starts, cmds)
            if nxt is not None:
                cmds.append(Timer(nxt, (_GATE,)))
        else:
            raise ValueError(f"unknown timer key {key!r}")
        self._flush_gate()
        return cmds

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        cmds: list[Command] = []
        fl = self._inflight.pop(response.request_id, None)
        if fl is None:
            raise ValueError(f"response for unknown request {response.request_id}")
        st = self._state[fl.sid]
        m = st.machine
        assert m is not None
        ok = response.status == "ok"
        outcome = m.on_output(response.output_ids, ok)
        tool_time = NAN
        if outcome.done:
            st.turns_done = fl.turn if ok else fl.turn - 1
        else:
            st.turns_done = fl.turn
            tool_time = float(outcome.tool_time or 0.0)
            if self.toolslow is not None:
                extra = self.toolslow.extra(now)
                if extra:
                    tool_time += extra
                    st.n_slowed += 1
                    self.tool_calls_slowed += 1
                    # the trigger sessions of a TOOLSLOW run are those with a slowed call (App. D)
                    self.sink.gate_event(time=now, event="slow", session=fl.sid)
        self.sink.turn(
            session=fl.sid,
            kind=st.spec.kind,
            turn=fl.turn,
            request_id=response.request_id,
            send_time=response.send_time,
            first_token_time=response.first_token_time,
            done_time=response.done_time,
            prompt_tokens=response.prompt_tokens,
            cached_tokens=response.cached_tokens,
            completion_tokens=response.completion_tokens,
            n_output_ids=None if response.output_ids is None else len(response.output_ids),
            queue_time=response.extra.get("queue_time") if response.extra else None,
            engine_ttft=response.extra.get("engine_ttft") if response.extra else None,
            engine_decode=response.extra.get("engine_decode") if response.extra else None,
            status=response.status,
            http_status=response.http_status,
            error=response.error,
        )
        if fl.prompt_len != response.prompt_tokens and ok:
            self.prompt_mismatches += 1
        if outcome.done:
            self._end_session(now, st, "completed" if m.phase is Phase.DONE else "failed", cmds)
        else:
            st.tool_pending = True
            cmds.append(Timer(now + tool_time, (_TOOL, fl.sid)))
        self._flush_gate()
        return cmds

    def finished(self) -> bool:
        return self._next_arrival >= len(self._order) and self._open == 0

    # ------------------------------------------------------------------ end of run
    def close(self, now: float) -> None:
        """Record what is still open at the end of the run (sessions and requests in flight)."""
        if self._closed:
            return
        self._closed = True
        for rid, fl in sorted(self._inflight.items()):
            st = self._state[fl.sid]
            self.sink.turn(
                session=fl.sid,
                kind=st.spec.kind,
                turn=fl.turn,
                request_id=rid,
                send_time=fl.send_time,
                done_time=None,
                status="unfinished",
            )
        for st in self._order:
            if st.arrived and not st.outcome:
                if st.paused_at is not None:
                    st.pause_time += now - st.paused_at
                self._write_session(st, "unfinished")
        self._flush_gate()

    # ------------------------------------------------------------------ state queries
    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def in_system(self) -> int:
        return self._open

    @property
    def held(self) -> int:
        return self.gate.n_queued + self.gate.n_paused

    def counters(self) -> dict[str, int]:
        """Run-level client counts for meta.json (rows do not carry them)."""
        pauses = sum(st.n_pauses for st in self._state)
        return {
            "sessions": len(self._state),
            "arrived": sum(st.arrived for st in self._state),
            "refused": sum(bool(st.spec.refused and st.arrived) for st in self._state),
            "requests": self._next_rid,
            "tool_calls_slowed": self.tool_calls_slowed,
            "pauses": pauses,
            "prompt_mismatches": self.prompt_mismatches,
        }

    def start_lateness(self, kind: str | None = None) -> list[float]:
        """Seconds each arrival played so far (of `kind`, 'base' or 'burst'; None: all) was behind
        its planned time, in play order; 0 in virtual time."""
        return [x for k, x in self._lateness if kind is None or k == kind]

    # ------------------------------------------------------------------ internals
    def _schedule_arrival(self, cmds: list[Command]) -> None:
        if self._next_arrival < len(self._order):
            cmds.append(Timer(self._order[self._next_arrival].spec.arrival, (_ARRIVE, self._next_arrival)))

    def _arrivals(self, now: float, cmds: list[Command]) -> None:
        # Everything due by now, so a driver whose timers fire late still plays every arrival.
        while self._next_arrival < len(self._order) and self._order[self._next_arrival].spec.arrival <= now + 1e-9:
            st = self._order[self._next_arrival]
            self._next_arrival += 1
            st.arrived = True
            st.seen = max(now, st.spec.arrival)
            self._lateness.append((st.spec.kind, st.seen - st.spec.arrival))
            if st.spec.refused:
                st.end = st.spec.arrival
                self._write_session(st, "refused")
                self.sink.gate_event(time=now, event="refuse", session=st.sid)
                continue
            self._open += 1
            starts = self.gate.arrive(now, st.sid)
            if not any(s.session == st.sid for s in starts):
                self._write_session(st, "unfinished")  # held at the gate: a killed run still shows it
            self._start_all(now, starts, cmds)
        self._schedule_arrival(cmds)

    def _start_all(self, now: float, starts: list[Start], cmds: list[Command]) -> None:
        for s in starts:
            st = self._state[s.session]
            if s.resumed:
                if st.paused_at is not None:
                    st.pause_time += now - st.paused_at
                    st.paused_at = None
            else:
                st.admission = now
                st.machine = SessionMachine(s.session, st.spec, self.workload)
                self._write_session(st, "unfinished")
            cmds.append(self._send(now, st))

    def _send(self, now: float, st: _SessionState) -> Send:
        m = st.machine
        assert m is not None
        prompt = m.next_prompt()
        rid = self._next_rid
        self._next_rid += 1
        self._inflight[rid] = _InFlight(m.sid, m.turn, int(prompt.shape[0]), now)
        return Send(rid, m.sid, m.turn, prompt, self.max_tokens)

    def _tool_end(self, now: float, sid: int, cmds: list[Command]) -> None:
        st = self._state[sid]
        st.tool_pending = False
        if self.gate.tool_end(now, sid):
            cmds.append(self._send(now, st))
        else:
            st.n_pauses += 1
            st.paused_at = now

    def _end_session(self, now: float, st: _SessionState, outcome: str, cmds: list[Command]) -> None:
        st.end = now
        self._open -= 1
        self._write_session(st, outcome)
        st.machine = None  # free the context
        self._start_all(now, self.gate.session_end(now, st.sid), cmds)

    def _write_session(self, st: _SessionState, outcome: str) -> None:
        if outcome != "unfinished":
            st.outcome = outcome
        p = st.spec
        adm = None if math.isnan(st.admission) else st.admission
        late = None if math.isnan(st.seen) else st.seen - p.arrival
        pause = st.pause_time
        self.sink.session(
            session=st.sid,
            kind=p.kind,
            stream=p.stream,
            index=p.index,
            arrival=p.arrival,
            admission=adm,
            end=None if math.isnan(st.end) else st.end,
            outcome=outcome,
            n_turns=p.n_turns,
            turns_done=st.turns_done,
            start_lateness=late,
            gate_wait=None if adm is None else adm - st.seen,
            paused_time=pause if st.n_pauses else None,
        )

    def _flush_gate(self) -> None:
        ev = self.gate.events
        cap = getattr(self.gate, "cap", None)
        while self._gate_flushed < len(ev):
            e: GateEvent = ev[self._gate_flushed]
            self._gate_flushed += 1
            self.sink.gate_event(
                time=e.time,
                event=e.kind,
                session=e.session,
                queue_new=e.queued,
                queue_resume=e.paused,
                admitted=e.admitted,
                cap=cap,
            )


def arm_client(
    sessions: Sequence[SessionSpec], workload: WorkloadConfig, arm: ArmConfig, cap: int | None, sink: RecordSink
) -> PlanClient:
    """The client that plays a plan under an arm's run-time rules: its gate at the resolved `cap`
    (`ArmConfig.gate_cap(test.cap)`) and its TOOLSLOW rule. Runs and replays build it alike, so a
    replay plays a recorded run's plan exactly as the run did."""
    ts = arm.toolslow
    return PlanClient(
        sessions,
        workload,
        gate=make_gate(arm.gate, cap),
        toolslow=ToolSlowRule(ts.start, ts.end, ts.delta) if ts else None,
        sink=sink,
    )
