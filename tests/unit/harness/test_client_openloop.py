"""The open-loop plan client on tiny plans, driven by a minimal virtual-time loop in this file."""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np
import pytest

from harness.client.contract import Send, Timer, TurnResponse
from harness.client.gates import FifoCapGate, RescueGate
from harness.client.openloop import ListSink, PlanClient, ToolSlowRule
from harness.config import WorkloadConfig
from harness.workload.draws import STREAM_BASE, STREAM_BURST, SessionSpec

WL = WorkloadConfig(name="tiny", first_prompt=20, tool_tokens=5, decode_tokens=3)


def spec(
    i: int, arrival: float, n: int, tool: float = 1.0, stream: int = STREAM_BASE, refused: bool = False
) -> SessionSpec:
    return SessionSpec(stream, i, arrival, n, tuple([tool] * (n - 1)), token_seed=1000 + i, refused=refused)


class MiniDriver:
    """Virtual time; each request is answered `service` s after it is sent (infinite servers),
    with `decode_tokens` output ids and a perfect cache (everything but the new tool ids)."""

    def __init__(
        self, client: PlanClient, service: float = 0.5, fail: set[int] | None = None, late: float = 0.0
    ) -> None:
        self.client = client
        self.service = service
        self.late = late  # arrival timers fire this late, as a wall-clock driver's may under load
        self.fail = fail or set()
        self.heap: list = []
        self.seq = itertools.count()
        self.sends: list[tuple[float, Send]] = []
        self.prev_len: dict[int, int] = {}

    def _push(self, now: float, cmds) -> None:
        for c in cmds:
            if isinstance(c, Timer):
                late = self.late if c.key[0] == "arrive" else 0.0
                heapq.heappush(self.heap, (c.at + late, next(self.seq), "timer", c.key))
            else:
                assert isinstance(c, Send)
                self.sends.append((now, c))
                heapq.heappush(self.heap, (now + self.service, next(self.seq), "resp", (now, c)))

    def run(self, until: float = math.inf) -> float:
        self._push(0.0, self.client.start(0.0))
        now = 0.0
        while self.heap and self.heap[0][0] <= until:
            now, _, what, x = heapq.heappop(self.heap)
            if what == "timer":
                self._push(now, self.client.on_timer(now, x))
            else:
                sent, c = x
                L = len(c.prompt)
                if c.request_id in self.fail:
                    r = TurnResponse(c.request_id, "error", sent, now, error="boom", http_status=500)
                else:
                    cached = self.prev_len.get(c.session, 0)
                    out = np.arange(WL.decode_tokens, dtype=np.int32) + 7
                    r = TurnResponse(c.request_id, "ok", sent, now, now - 0.1, out, L, cached, len(out), 200)
                    self.prev_len[c.session] = L + len(out)
                self._push(now, self.client.on_response(now, r))
        return now


def test_open_loop_arrivals_ignore_a_slow_server() -> None:
    plan = [spec(i, 10.0 * i, 2) for i in range(5)]
    c = PlanClient(plan, WL)
    d = MiniDriver(c, service=1000.0)
    d.run()
    first = [(t, s.session) for t, s in d.sends if s.turn == 1]
    assert first == [(10.0 * i, i) for i in range(5)]
    assert c.finished()


def test_prompt_is_previous_prompt_plus_returned_ids_plus_tool_ids() -> None:
    plan = [spec(0, 0.0, 4, tool=2.0)]
    c = PlanClient(plan, WL)
    d = MiniDriver(c, service=0.5)
    d.run()
    sends = [s for _, s in d.sends]
    assert [len(s.prompt) for s in sends] == [WL.prompt_len(k) for k in range(1, 5)]
    for a, b in itertools.pairwise(sends):
        n = len(a.prompt)
        assert np.array_equal(b.prompt[:n], a.prompt)
        assert np.array_equal(b.prompt[n : n + WL.decode_tokens], np.arange(WL.decode_tokens) + 7)
    times = [t for t, _ in d.sends]
    assert times == pytest.approx([0.0, 2.5, 5.0, 7.5])  # response + tool time
    assert all(s.max_tokens == WL.decode_tokens for s in sends)


def test_records_turns_and_sessions() -> None:
    plan = [spec(0, 0.0, 3), spec(1, 1.0, 1, stream=STREAM_BURST)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink)
    MiniDriver(c).run()
    assert len(sink.turns) == 4
    assert {r["kind"] for r in sink.turns} == {"base", "burst"}
    s0 = next(r for r in sink.sessions if r["session"] == 0)
    assert s0["outcome"] == "completed" and s0["turns_done"] == 3 and s0["admission"] == 0.0
    assert s0["end"] == pytest.approx(0.5 * 3 + 2.0)
    t0 = sorted((r for r in sink.turns if r["session"] == 0), key=lambda r: r["turn"])
    assert t0[1]["cached_tokens"] == WL.first_prompt + WL.decode_tokens and t0[1]["prompt_tokens"] == WL.prompt_len(2)
    assert t0[0]["n_output_ids"] == WL.decode_tokens and t0[0]["status"] == "ok"
    assert c.counters()["prompt_mismatches"] == 0 and c.counters()["requests"] == 4


def test_error_ends_session_without_retry() -> None:
    plan = [spec(0, 0.0, 5)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink)
    d = MiniDriver(c, fail={1})  # the second request fails
    d.run()
    assert len(d.sends) == 2
    assert sink.sessions[0]["outcome"] == "failed" and sink.sessions[0]["turns_done"] == 1
    assert sink.turns[-1]["status"] == "error" and sink.turns[-1]["error"] == "boom"
    assert c.finished()


def test_shed_refusals_are_recorded_and_never_sent() -> None:
    plan = [spec(0, 0.0, 1), spec(1, 5.0, 2, refused=True), spec(2, 6.0, 1)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink)
    d = MiniDriver(c)
    d.run()
    assert {s.session for _, s in d.sends} == {0, 2}
    out = {r["session"]: r["outcome"] for r in sink.sessions}
    assert out == {0: "completed", 1: "refused", 2: "completed"}
    assert [(e["event"], e["session"]) for e in sink.gate_events] == [("refuse", 1)]


def test_toolslow_lengthens_tool_calls_that_start_in_window() -> None:
    plan = [spec(0, 0.0, 4, tool=1.0)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink, toolslow=ToolSlowRule(start=1.0, end=2.0, delta=10.0))
    d = MiniDriver(c, service=0.5)
    d.run()
    # turn 1 done at 0.5 (tool 1 s, outside) -> send at 1.5; done 2.0 (outside, end exclusive)
    # so no call is slowed with end=2.0; shift the window to cover the second tool call
    assert c.counters()["tool_calls_slowed"] == 0
    sink2 = ListSink()
    c2 = PlanClient(plan, WL, sink=sink2, toolslow=ToolSlowRule(start=1.9, end=2.1, delta=10.0))
    d2 = MiniDriver(c2, service=0.5)
    d2.run()
    assert [t for t, _ in d2.sends] == pytest.approx([0.0, 1.5, 13.0, 14.5])
    assert c2.counters()["tool_calls_slowed"] == 1


def test_capped_gate_bounds_sessions_between_admission_and_end() -> None:
    plan = [spec(i, 0.1 * i, 3, tool=5.0) for i in range(12)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink, gate=FifoCapGate(3))
    MiniDriver(c, service=1.0).run()
    rows = sorted(sink.sessions, key=lambda r: r["session"])
    assert all(r["outcome"] == "completed" for r in rows)
    # at any instant at most 3 sessions are between admission and end (tool calls included)
    events = sorted([(r["admission"], 1) for r in rows] + [(r["end"], -1) for r in rows], key=lambda x: (x[0], x[1]))
    n = peak = 0
    for _, d in events:
        n += d
        peak = max(peak, n)
    assert peak == 3
    # FIFO: admission order is arrival order
    adm = [r["admission"] for r in rows]
    assert adm == sorted(adm)
    assert rows[3]["admission"] == rows[0]["end"]  # the 4th waits for the first to end
    assert {e["event"] for e in sink.gate_events} >= {"queue", "admit"}
    assert rows[3]["gate_wait"] == pytest.approx(rows[3]["admission"] - rows[3]["arrival"])


def test_close_records_open_sessions_and_requests() -> None:
    plan = [spec(0, 0.0, 3, tool=1.0), spec(1, 0.5, 3, tool=100.0), spec(2, 1.0, 2), spec(3, 50.0, 1)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink, gate=FifoCapGate(2))
    d = MiniDriver(c, service=10.0)
    end = d.run(until=12.0)
    assert not c.finished()
    c.close(end)
    rows = {r["session"]: r for r in sink.sessions}
    # 0: second turn in flight; 1: in its 100 s tool call; 2: held at the gate; 3: not arrived yet
    assert sorted(rows) == [0, 1, 2]
    assert all(r["outcome"] == "unfinished" and r["end"] is None for r in rows.values())
    assert rows[2]["admission"] is None and rows[0]["admission"] == 0.0
    open_turns = [r for r in sink.turns if r["status"] == "unfinished"]
    assert [(r["session"], r["turn"]) for r in open_turns] == [(0, 2)]
    assert open_turns[0]["done_time"] is None


def test_rescue_gate_pauses_and_resumes_through_the_client() -> None:
    plan = [spec(i, 0.0, 4, tool=3.0) for i in range(6)]
    sink = ListSink()
    gate = RescueGate(2, t_on=1.0, hold=5.0, min_after=10.0, tick=1.0)
    c = PlanClient(plan, WL, sink=sink, gate=gate)
    MiniDriver(c, service=1.0).run()
    assert c.finished()
    rows = {r["session"]: r for r in sink.sessions}
    assert all(r["outcome"] == "completed" and r["turns_done"] == 4 for r in rows.values())
    assert c.counters()["pauses"] >= 4
    assert sum((r["paused_time"] or 0.0) for r in rows.values()) > 0
    ev = [e["event"] for e in sink.gate_events]
    assert ev[0] == "engage" and ev[-1] == "release"
    assert ev.count("pause") == ev.count("resume") == c.counters()["pauses"]
    assert gate.release_time is not None and gate.release_time >= 11.0


def test_start_lateness_and_gate_wait_are_recorded_apart() -> None:
    # Arrival timers fire 0.25 s late (a wall-clock client sharing the CPU with its engine). Without
    # a gate nothing waits at a gate: the lateness is the client's, recorded as such.
    plan = [spec(i, 1.0 * i, 2) for i in range(5)]
    sink = ListSink()
    c = PlanClient(plan, WL, sink=sink)
    MiniDriver(c, service=0.5, late=0.25).run()
    rows = sorted(sink.sessions, key=lambda r: r["session"])
    assert [r["gate_wait"] for r in rows] == [0.0] * 5
    assert [r["start_lateness"] for r in rows] == pytest.approx([0.25] * 5)
    assert c.start_lateness() == pytest.approx([0.25] * 5)
    # With a gate the two add up to the delay before admission, each in its own column.
    sink2 = ListSink()
    c2 = PlanClient([spec(i, 0.0, 2, tool=5.0) for i in range(3)], WL, sink=sink2, gate=FifoCapGate(1))
    MiniDriver(c2, service=1.0, late=0.25).run()
    rows2 = sorted(sink2.sessions, key=lambda r: r["session"])
    for r in rows2:
        assert r["start_lateness"] == pytest.approx(0.25)
        assert r["admission"] == pytest.approx(r["arrival"] + r["start_lateness"] + r["gate_wait"])
    assert rows2[0]["gate_wait"] == 0.0 and rows2[1]["gate_wait"] == pytest.approx(rows2[0]["end"] - 0.25)
    # and on time (virtual time) the lateness is exactly zero
    sink3 = ListSink()
    c3 = PlanClient(plan, WL, sink=sink3)
    MiniDriver(c3, service=0.5).run()
    assert all(r["start_lateness"] == 0.0 and r["gate_wait"] == 0.0 for r in sink3.sessions)
