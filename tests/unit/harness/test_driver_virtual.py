"""The virtual-time driver: determinism, any-Client driving, closed populations, run records."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import pandas as pd
import pytest

from harness.client.closed import ClosedClient
from harness.client.contract import Command, Send, Timer, TurnResponse
from harness.client.openloop import PlanClient
from harness.config import CellConfig, WorkloadConfig
from harness.drivers.virtual import simulate
from harness.refengine.model import EngineModel
from harness.workload.draws import STREAM_BASE, draw_session

WL = WorkloadConfig(name="small", first_prompt=500, tool_tokens=100, decode_tokens=20)


def cell(**kw: object) -> CellConfig:
    base: dict[str, object] = {
        "name": "t",
        "engine": {"name": "sglang", "version": "t"},
        "model": "m",
        "gpu": "g",
        "kv_pool_tokens": 60_000,
    }
    base.update(kw)
    return CellConfig.model_validate(base)


def test_closed_population_is_deterministic_and_constant():
    def run() -> pd.DataFrame:
        c = ClosedClient(WL, 6, seed=3)
        res = simulate(c, EngineModel(cell()), until=300.0, gauge_interval=None)
        assert res.status == "HORIZON" and res.end_time == 300.0
        return pd.DataFrame(c.sink.turns)

    a, b = run(), run()
    pd.testing.assert_frame_equal(a, b)
    assert len(a) > 100
    # six sessions always in the system: at most six requests in flight at any time
    ev = pd.concat([pd.Series(1, index=a.send_time), pd.Series(-1, index=a.done_time.dropna())]).sort_index(
        kind="stable"
    )
    assert ev.cumsum().max() <= 6


def test_closed_replacement_keeps_session_order_and_hits():
    c = ClosedClient(WL, 2, seed=0)
    simulate(c, EngineModel(cell()), until=600.0, gauge_interval=None)
    s = pd.DataFrame(c.sink.sessions)
    done = s[s.outcome == "completed"]
    assert len(done) >= 2
    t = pd.DataFrame(c.sink.turns)
    follow = t[(t.turn > 1) & (t.status == "ok")]
    assert (follow.prompt_tokens - follow.cached_tokens == WL.tool_tokens + 1).all()


class _Scripted:
    """A minimal client: one oversize request (refused), one timer, then one normal request."""

    def __init__(self) -> None:
        self.responses: list[TurnResponse] = []
        self.timers: list[float] = []
        self._done = False

    def start(self, now: float) -> Sequence[Command]:
        big = np.ones(50_000, dtype=np.int32)
        return [Send(0, 0, 1, big, 10), Timer(2.5, "go")]

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        self.timers.append(now)
        return [Send(1, 0, 1, np.arange(4, 104, dtype=np.int32), 10)]

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        self.responses.append(response)
        self._done = response.request_id == 1
        return []

    def finished(self) -> bool:
        return self._done


def test_any_client_refusals_and_timers():
    c = _Scripted()
    res = simulate(c, EngineModel(cell()), gauge_interval=None)
    assert res.status == "COMPLETED"
    assert [r.status for r in c.responses] == ["error", "ok"]
    assert c.responses[0].http_status == 400
    assert c.timers == [2.5]
    ok = c.responses[1]
    assert ok.send_time == 2.5 and ok.done_time > ok.first_token_time > 2.5
    assert ok.prompt_tokens == 100 and ok.completion_tokens == 10 and len(ok.output_ids) == 10


class _Silent:
    """A client that never finishes and never asks for anything: it waits for nothing."""

    def start(self, now: float) -> Sequence[Command]:
        return []

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        return []

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        return []

    def finished(self) -> bool:
        return False


def test_a_client_left_waiting_for_nothing_is_not_reported_completed():
    res = simulate(_Silent(), EngineModel(cell()), until=50.0, gauge_interval=None)
    assert res.status == "HORIZON" and res.end_time == 50.0
    with pytest.raises(RuntimeError, match="stalled"):
        simulate(_Silent(), EngineModel(cell()), gauge_interval=None)


def test_plan_client_runs_open_loop():
    specs = [draw_session(WL, 0, STREAM_BASE, i, arrival=float(5 * i)) for i in range(8)]
    pc = PlanClient(specs, WL)
    res = simulate(pc, EngineModel(cell()), until=5000.0, gauge_interval=None)
    assert res.status == "COMPLETED" and pc.finished()
    s = pd.DataFrame(pc.sink.sessions)
    assert (s.outcome == "completed").sum() == 8


def test_run_records_and_gauges(tmp_path):
    from harness.recording.record import RunRecorder, load_run

    with RunRecorder(tmp_path / "run", {"what": "test"}) as rec:
        c = ClosedClient(WL, 3, seed=1, sink=rec)
        res = simulate(c, EngineModel(cell()), recorder=rec, until=100.0, gauge_interval=5.0)
    data = load_run(tmp_path / "run")
    assert len(data.gauges) == 21 and list(data.gauges.time[:3]) == [0.0, 5.0, 10.0]
    assert data.gauges.pool_tokens.iloc[-1] == 60_000
    assert (data.turns.status == "ok").sum() == res.ok
    assert (data.turns.status == "unfinished").sum() == res.in_flight
    assert set(data.sessions.outcome) <= {"completed", "unfinished"}
