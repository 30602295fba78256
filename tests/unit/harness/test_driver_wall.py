"""The asyncio driver plays a plan end to end against the emulator in both dialects.

Small workload (L0 256, Delta 64, d 8), a handful of sessions, time scale 100: each run takes a
few wall seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from harness.client.contract import Command, Send, Timer, TurnResponse
from harness.client.openloop import ListSink, PlanClient
from harness.config import CellConfig, WorkloadConfig, load_config
from harness.drivers.wall import drive
from harness.emulator.server import Emulator, Faults, serve
from harness.recording.progress import RunProgress
from harness.recording.record import RunRecorder, load_run
from harness.recording.schema import RunStatus
from harness.servers import get_adapter
from harness.workload.draws import STREAM_BASE, draw_session

pytestmark = [pytest.mark.timeout(60), pytest.mark.wallclock]  # wall-clock drives: one rerun if a try is late

SCALE = 100.0
WL = WorkloadConfig(name="tiny", first_prompt=256, tool_tokens=64, decode_tokens=8)


def small_cell(flavor: str) -> CellConfig:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    return base.model_copy(update={"kv_pool_tokens": 60_000, "context_length": 8192})


@contextlib.asynccontextmanager
async def emulator(
    flavor: str, *, faults: Faults | None = None, time_scale: float = SCALE
) -> AsyncIterator[tuple[Emulator, str]]:
    emu = Emulator(small_cell(flavor), flavor=flavor, time_scale=time_scale, model_name="tiny", faults=faults)
    runner, url = await serve(emu, "127.0.0.1", 0)
    try:
        yield emu, url
    finally:
        await runner.cleanup()


def sessions(n: int, gap: float = 3.0, max_turns: int = 6) -> list[Any]:
    out = []
    for i in range(n):
        s = draw_session(WL, 7, STREAM_BASE, i, arrival=i * gap)
        if s.n_turns > max_turns:  # keep the test short but multi-turn
            s = type(s)(**{**s.__dict__, "n_turns": max_turns, "tool_times": s.tool_times[: max_turns - 1]})
        out.append(s)
    return out


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_plan_end_to_end_hits_and_gauges(flavor: str, tmp_path: Any) -> None:
    plan = sessions(6)
    sink = ListSink()
    client = PlanClient(plan, WL, sink=sink)
    stream = io.StringIO()
    progress = RunProgress(duration=None, title=f"test {flavor}", log_every=0.0, live=False, stream=stream)

    async def go() -> Any:
        async with emulator(flavor) as (emu, url):
            ad = get_adapter("emulator", flavor=flavor, cell=emu.cell)
            rec = RunRecorder(tmp_path / "run", {"test": flavor})
            res = await drive(
                client,
                ad,
                url,
                model_name="tiny",
                time_scale=SCALE,
                recorder=rec,
                gauge_interval=5.0,
                progress=progress,
                handle_signals=False,
            )
            rec.close(res.status, res.reason)
            return res, emu.cell.page_size

    res, bs = asyncio.run(go())
    assert res.status == RunStatus.COMPLETED and res.reason == "client finished"
    assert not res.flagged and res.errors == 0 and res.timeouts == 0
    assert res.sent == res.ok == sum(s.n_turns for s in plan) == len(sink.turns)
    # plan time runs time_scale times faster than the wall
    assert res.plan_time == pytest.approx(res.wall_seconds * SCALE, rel=0.05)
    assert res.lateness["arrive"].size == len(plan)

    turns = {(r["session"], r["turn"]): r for r in sink.turns}
    for (sid, k), r in turns.items():
        assert r["status"] == "ok"
        assert r["prompt_tokens"] == WL.prompt_len(k)
        assert r["send_time"] <= r["first_token_time"] <= r["done_time"]
        if k == 1:
            assert r["cached_tokens"] == 0
        else:
            # the previous prompt and its output, less the output's last token (never computed)
            reusable = WL.prompt_len(k - 1) + WL.decode_tokens - 1
            expected = reusable if flavor == "sglang" else reusable // bs * bs
            assert r["cached_tokens"] == expected, (sid, k)
    first = min(r["send_time"] for r in sink.turns)
    assert first == pytest.approx(0.0, abs=0.5 * SCALE / 100)  # session 0 arrives at t=0
    if flavor == "sglang":  # /generate's meta_info: the engine's own times, recorded in plan seconds
        step = small_cell(flavor).cost.model().decode_time(1, 0.0)  # the cheapest decode iteration
        for r in sink.turns:
            assert r["queue_time"] >= 0 and r["engine_ttft"] > 0
            # d - 1 decode iterations, each at least the cheapest: in engine (= plan) seconds, not wall
            assert (WL.decode_tokens - 1) * step * 0.99 <= r["engine_decode"]
            # within the turn as the client saw it, less the emulator's clock lead (1 ms wall)
            lead = 0.001 * SCALE
            assert r["queue_time"] + r["engine_ttft"] + r["engine_decode"] <= r["done_time"] - r["send_time"] + lead

    data = load_run(tmp_path / "run")
    g = data.gauges
    assert len(g) >= 3 and res.gauge_scrapes == len(g)
    assert g["time"].is_monotonic_increasing
    assert g["prompt_tokens_total"].iloc[-1] > 0 and g["pool_tokens"].iloc[-1] == 60_000
    assert "hit_1min=" in stream.getvalue()


def test_horizon_ends_run_and_open_requests_are_recorded() -> None:
    plan = sessions(4, gap=1.0)
    sink = ListSink()
    client = PlanClient(plan, WL, sink=sink)

    async def go() -> Any:
        async with emulator("sglang") as (emu, url):
            ad = get_adapter("emulator", flavor="sglang", cell=emu.cell)
            return await drive(
                client,
                ad,
                url,
                model_name="tiny",
                time_scale=SCALE,
                duration=12.0,
                gauge_interval=None,
                handle_signals=False,
            )

    res = asyncio.run(go())
    assert res.status == RunStatus.COMPLETED and "horizon" in res.reason
    assert res.plan_time == pytest.approx(12.0, abs=1.0)
    # close(now) was called: every session that arrived has a row, open ones included
    assert {r["session"] for r in sink.sessions} == {0, 1, 2, 3}


def test_stop_event_interrupts() -> None:
    plan = sessions(3, gap=1.0)
    client = PlanClient(plan, WL, sink=ListSink())

    async def go() -> Any:
        async with emulator("vllm") as (emu, url):
            ad = get_adapter("emulator", flavor="vllm", cell=emu.cell)
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.05, stop.set)
            return await drive(
                client,
                ad,
                url,
                model_name="tiny",
                time_scale=SCALE,
                stop_event=stop,
                gauge_interval=None,
                handle_signals=False,
            )

    res = asyncio.run(go())
    assert res.status == RunStatus.INTERRUPTED and res.wall_seconds < 2.0


class _Ticker:
    """A minimal Client: n timers at fixed plan times and one single-turn request per timer."""

    def __init__(self, times: Sequence[float], prompt_len: int = 64) -> None:
        self.times = list(times)
        self.prompt = np.arange(4, 4 + prompt_len, dtype=np.int32)
        self.responses: list[TurnResponse] = []
        self.fired: list[float] = []

    def start(self, now: float) -> Sequence[Command]:
        return [Timer(t, ("tick", i)) for i, t in enumerate(self.times)]

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        self.fired.append(now)
        return [Send(key[1], key[1], 1, self.prompt, 4)]  # type: ignore[index]

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        self.responses.append(response)
        return []

    def finished(self) -> bool:
        return len(self.responses) == len(self.times)


def test_any_client_timers_fire_on_the_scaled_clock() -> None:
    client = _Ticker([0.0, 10.0, 20.0, 30.0])

    async def go() -> Any:
        async with emulator("sglang") as (emu, url):
            ad = get_adapter("emulator", flavor="sglang", cell=emu.cell)
            return await drive(
                client, ad, url, model_name="tiny", time_scale=SCALE, gauge_interval=None, handle_signals=False
            )

    res = asyncio.run(go())
    assert res.status == RunStatus.COMPLETED and res.ok == 4
    # each timer fired at its plan time (lateness is in wall seconds; plan = wall x scale)
    for due, now in zip(client.times, client.fired):
        assert due <= now + 1e-6 and now - due < 0.05 * SCALE
    assert np.all(res.lateness["tick"] >= 0) and res.lateness_quantile("tick", 0.99) < 0.05
    assert all(r.status == "ok" and r.output_ids is not None and r.output_ids.size == 4 for r in client.responses)


def test_unreachable_server_fails_the_run() -> None:
    from harness.servers import free_port

    client = _Ticker([0.0, 1.0])
    ad = get_adapter("emulator", flavor="sglang", cell=small_cell("sglang"))
    url = f"http://127.0.0.1:{free_port()}"
    res = asyncio.run(
        drive(client, ad, url, model_name="tiny", time_scale=SCALE, gauge_interval=None, handle_signals=False)
    )
    assert res.status == "FAILED" and "server died" in res.reason and "refused" in res.reason
    assert client.responses and client.responses[0].status == "error"


def test_runner_executes_an_arm_on_the_emulator(tmp_path: Any) -> None:
    """`execute_run(..., engine='emulator')`: plan, launch, canary, drive, stop, record."""
    import sys

    import yaml

    from harness.config import load_test
    from runs.arms import execute_run

    cell = small_cell("sglang").model_copy(
        update={"name": "tiny-sglang", "lambda_ref": 0.1, "all_miss_token_rate": 5000.0}
    )
    (tmp_path / "cells").mkdir()
    (tmp_path / "workloads").mkdir()
    (tmp_path / "protocols").mkdir()
    (tmp_path / "cells" / "tiny-sglang.yaml").write_text(
        yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"}))
    )
    wl = {
        "kind": "workload",
        "name": "tiny",
        "first_prompt": 256,
        "tool_tokens": 64,
        "decode_tokens": 8,
        "turns": {"mean": 3.0, "cap": 5},
        "tool_time": {"mean": 2.0},
    }
    (tmp_path / "workloads" / "tiny.yaml").write_text(yaml.safe_dump(wl))
    proto = {
        "kind": "protocol",
        "name": "short",
        "duration": 200.0,
        "burst": {"time": 50.0, "size": 0, "width": 10.0},
        "window": {"start": 100.0, "end": 200.0},
        "min_window": 50.0,
        "gauge_interval": 5.0,
    }
    (tmp_path / "protocols" / "short.yaml").write_text(yaml.safe_dump(proto))
    test = {
        "kind": "test",
        "name": "tiny-e2e",
        "cell": "tiny-sglang",
        "workload": "tiny",
        "protocol": "short",
        "arms": ["noburst"],
        "rates": [1.0],
        "seeds": [0],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    bundle = load_test(tmp_path / "test.yaml")
    opts = {
        "time_scale": SCALE,
        "server_cmd": (sys.executable, "-m", "harness.emulator"),
        "extra_args": ("--log-level", "WARNING"),
        "smoke": False,
        "health_timeout": 30.0,
        "progress": False,
    }
    res = execute_run(bundle, "noburst", 1.0, 0, "emulator", tmp_path / "run", options=opts)
    assert res.status == "COMPLETED", res.reason
    data = load_run(tmp_path / "run")
    assert data.meta["engine_backend"] == "emulator" and data.meta["preflight"]["canary"]["passed"] is True
    assert len(data.turns) > 0 and (data.turns["status"] == "ok").all()
    follow = data.turns[data.turns["turn"] > 1]
    assert len(follow) > 0 and (follow["cached_tokens"] * 2 > follow["prompt_tokens"]).mean() > 0.9
    assert len(data.gauges) >= 30  # 200 plan seconds / 5


# ---------------------------------------------------------------------------------------------
# driver: 5xx replies from a server whose /health says it is dead end the run as FAILED
# ---------------------------------------------------------------------------------------------
class _Chain:
    """A minimal client: one single-turn request at a time, the next sent when the last is answered,
    finished after `n` answers (n = None: never finished)."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self.responses: list[Any] = []

    def _send(self, i: int) -> list[Any]:
        from harness.client.contract import Send

        return [Send(i, i, 1, np.arange(4, 68, dtype=np.int32), 4)]

    def start(self, now: float) -> list[Any]:
        return self._send(0)

    def on_timer(self, now: float, key: Any) -> list[Any]:
        return []

    def on_response(self, now: float, response: Any) -> list[Any]:
        self.responses.append(response)
        return [] if self.finished() else self._send(len(self.responses))

    def finished(self) -> bool:
        return self.n is not None and len(self.responses) >= self.n


async def _serve(health_status: int) -> tuple[web.AppRunner, str]:
    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": {"message": "EngineCore encountered an issue", "code": 500}}, status=500)

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=health_status)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _drive_against(health_status: int, client: Any, duration: float) -> Any:
    async def go() -> Any:
        runner, url = await _serve(health_status)
        try:
            ad = get_adapter("emulator", flavor="vllm", cell=small_cell("vllm"))
            return await drive(
                client, ad, url, model_name="m", duration=duration, gauge_interval=None, handle_signals=False
            )
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_5xx_with_dead_health_fails_the_run() -> None:
    client = _Chain(None)  # never finishes on its own: only the probe can end the drive early
    res = _drive_against(503, client, duration=20.0)
    assert res.status == RunStatus.FAILED and "server died" in res.reason and "503" in res.reason
    assert res.wall_seconds < 10.0
    assert client.responses and all(r.status == "error" and r.http_status == 500 for r in client.responses)


def test_5xx_with_healthy_server_is_a_per_turn_error() -> None:
    client = _Chain(3)
    res = _drive_against(200, client, duration=20.0)
    assert res.status == "COMPLETED" and res.errors == 3 and res.flagged


def test_wall_clock_lateness_is_not_a_gate_wait() -> None:
    # On the wall clock every arrival timer fires a little late; without a gate that lateness must
    # land in start_lateness, and "gate waited" (analysis.metrics) must count no session.
    import pandas as pd

    from analysis.metrics import gated_intervals

    plan = sessions(8, gap=0.5, max_turns=2)
    sink = ListSink()
    client = PlanClient(plan, WL, sink=sink)

    async def go() -> Any:
        async with emulator("vllm") as (emu, url):
            ad = get_adapter("emulator", flavor="vllm", cell=emu.cell)
            return await drive(
                client, ad, url, model_name="tiny", time_scale=SCALE, gauge_interval=None, handle_signals=False
            )

    res = asyncio.run(go())
    assert res.status == RunStatus.COMPLETED
    rows = sink.sessions
    assert len(rows) == 8 and all(r["outcome"] == "completed" for r in rows)
    assert all(r["gate_wait"] == 0.0 for r in rows)
    late = np.array([r["start_lateness"] for r in rows])
    assert (late >= 0).all() and late.max() > 0  # a real clock is not exactly on time ...
    assert np.allclose([r["admission"] - r["arrival"] for r in rows], late)  # ... and that is all of the delay
    assert sorted(client.start_lateness()) == pytest.approx(sorted(late))
    s, e = gated_intervals(pd.DataFrame(rows))
    assert np.all(e - s <= 1e-9)
