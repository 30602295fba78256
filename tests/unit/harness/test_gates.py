"""Gate semantics: slots held through tool calls, FIFO order, rescue attrition/pause/resume and release."""

from __future__ import annotations

import pytest

from harness.client.gates import FifoCapGate, NoGate, RescueGate, Start, make_gate
from harness.config import Gate


def sids(starts: list[Start]) -> list[tuple[int, bool]]:
    return [(s.session, s.resumed) for s in starts]


def test_nogate_admits_everyone() -> None:
    g = NoGate()
    assert sids(g.arrive(0.0, 1)) == [(1, False)]
    assert g.tool_end(1.0, 1)
    assert g.session_end(2.0, 1) == []
    assert g.events == []


def test_fifo_cap_holds_slot_through_tool_calls() -> None:
    g = FifoCapGate(2)
    assert sids(g.arrive(0.0, 0)) == [(0, False)]
    assert sids(g.arrive(1.0, 1)) == [(1, False)]
    assert g.arrive(2.0, 2) == []  # held at the gate
    assert g.arrive(3.0, 3) == []
    assert g.n_queued == 2
    # session 0 is in a tool call: it keeps its slot, nobody is admitted
    assert g.tool_end(4.0, 0) is True
    assert g.n_queued == 2 and g.admitted == {0, 1}
    # session 1 ends: the head of the queue (2) gets the slot, FIFO
    assert sids(g.session_end(5.0, 1)) == [(2, False)]
    assert sids(g.session_end(6.0, 0)) == [(3, False)]
    assert g.n_queued == 0
    kinds = [(e.kind, e.session) for e in g.events]
    assert kinds == [("admit", 0), ("admit", 1), ("queue", 2), ("queue", 3), ("admit", 2), ("admit", 3)]


def test_fifo_cap_never_exceeds_cap() -> None:
    g = FifoCapGate(3)
    for i in range(10):
        g.arrive(float(i), i)
        assert len(g.admitted) <= 3
    ended = 0
    while g.admitted:
        sid = min(g.admitted)
        g.session_end(20.0 + ended, sid)
        ended += 1
        assert len(g.admitted) <= 3
    assert ended == 10


def test_make_gate_from_config() -> None:
    assert isinstance(make_gate(None), NoGate)
    g = make_gate(Gate(kind="fifo_cap", cap=5), cap_override=20)
    assert isinstance(g, FifoCapGate) and g.cap == 20
    r = make_gate(Gate(kind="rescue", cap=20, t_on=1800.0))
    assert (
        isinstance(r, RescueGate) and r.t_on == 1800.0 and r.hold == 300.0 and r.min_after == 600.0 and r.tick == 10.0
    )


def _trapped_rescue(cap: int = 2, n: int = 5) -> RescueGate:
    g = RescueGate(cap, t_on=100.0, hold=300.0, min_after=600.0, tick=10.0)
    for i in range(n):  # before t_on the gate does not bind
        assert sids(g.arrive(float(i), i)) == [(i, False)]
    return g


def test_rescue_does_not_bind_before_t_on() -> None:
    g = _trapped_rescue()
    assert len(g.admitted) == 5 and g.events == []
    assert g.tool_end(50.0, 0) is True


def test_rescue_engages_by_attrition_and_pause() -> None:
    g = _trapped_rescue(cap=2, n=5)
    starts, nxt = g.on_timer(100.0)
    assert starts == [] and nxt == 700.0  # first tick at t_on + 600
    assert g.events[-1].kind == "engage"
    assert len(g.admitted) == 5  # nobody evicted at t_on
    # a tool call ends while more than cap are admitted: the session pauses and yields its slot
    assert g.tool_end(110.0, 0) is False
    assert g.tool_end(111.0, 1) is False
    assert g.tool_end(112.0, 2) is False
    assert len(g.admitted) == 2 and list(g.resumes) == [0, 1, 2]
    # now exactly cap admitted: the next tool end goes on
    assert g.tool_end(113.0, 3) is True
    # new arrivals wait behind the resume queue
    assert g.arrive(114.0, 10) == []
    # a session ends: the resume queue is served first, FIFO
    assert sids(g.session_end(120.0, 3)) == [(0, True)]
    assert sids(g.session_end(121.0, 4)) == [(1, True)]
    assert sids(g.session_end(122.0, 0)) == [(2, True)]
    assert sids(g.session_end(123.0, 1)) == [(10, False)]
    assert g.n_paused == 0 and g.n_queued == 0
    kinds = [e.kind for e in g.events]
    assert kinds == ["engage", "pause", "pause", "pause", "queue", "resume", "resume", "resume", "admit"]


def test_rescue_release_tick_rule() -> None:
    g = _trapped_rescue(cap=2, n=3)
    _, nxt = g.on_timer(100.0)
    assert nxt == 700.0
    assert g.tool_end(150.0, 0) is False  # paused
    # the resume queue empties at 555 s: the hold runs from there
    assert sids(g.session_end(555.0, 1)) == [(0, True)]
    assert g.empty_since == 555.0
    t = nxt
    released_at = None
    while t is not None and t < 2000:
        _, t2 = g.on_timer(t)
        if g.released:
            released_at = t
            break
        assert t2 == t + 10.0
        t = t2
    # first tick >= 700 with the queues empty for 300 s since 555: 855 is not on the grid -> 860
    assert released_at == 860.0
    assert g.events[-1].kind == "release"
    # after release the gate no longer binds
    assert g.tool_end(900.0, 0) is True
    assert sids(g.arrive(901.0, 7)) == [(7, False)]


def test_rescue_release_not_before_min_after() -> None:
    g = _trapped_rescue(cap=10, n=3)  # never binds: queues empty from t_on
    _, nxt = g.on_timer(100.0)
    _, nxt2 = g.on_timer(nxt)
    assert g.released and g.release_time == 700.0 and nxt2 is None


def test_rescue_hold_restarts_when_someone_is_held() -> None:
    g = _trapped_rescue(cap=1, n=2)
    g.on_timer(100.0)
    assert g.tool_end(650.0, 0) is False  # held at 650
    assert sids(g.session_end(690.0, 1)) == [(0, True)]  # empty again from 690
    t, released = 700.0, None
    while released is None:
        _, nt = g.on_timer(t)
        if g.released:
            released = t
        else:
            t = nt
    assert released == 990.0  # first tick >= 690 + 300


def test_rescue_ticks_stay_on_the_grid_when_timers_fire_late() -> None:
    # a wall-clock driver hands the gate the time its timer actually fired, a little late; the
    # next tick must come from the absolute grid, or the lateness accumulates tick after tick
    g = _trapped_rescue(cap=1, n=2)
    _, t = g.on_timer(100.0)
    assert g.tool_end(650.0, 0) is False
    assert sids(g.session_end(690.0, 1)) == [(0, True)]
    released = None
    for _ in range(100):
        _, nt = g.on_timer(t + 0.004)  # every timer fires 4 ms late
        if g.released:
            released = t
            break
        assert nt == t + 10.0  # on the grid, not 4 ms later each time
        t = nt
    assert released == 990.0
    assert g.release_time == pytest.approx(990.004)


def test_rescue_first_tick_on_grid_when_t_on_off_grid() -> None:
    g = RescueGate(5, t_on=1803.0)
    assert g.first_tick() == 2410.0


@pytest.mark.parametrize("cap", [0, -1])
def test_bad_cap(cap: int) -> None:
    with pytest.raises(ValueError):
        FifoCapGate(cap)
