"""Regression tests for the real-engine path: the canary's threshold, a server whose engine died
behind a live HTTP front, a cache-off preflight against a failing server, and the emulator's clock."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from harness.aio_driver import FAILED, drive
from harness.config import CellConfig, load_config
from harness.engines import ParsedTurn, get_adapter
from harness.engines.base import EngineAdapter
from harness.engines.smoke import canary, expected_cached

pytestmark = pytest.mark.timeout(60)


def _cell(flavor: str = "sglang") -> CellConfig:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    return base.model_copy(update={"kv_pool_tokens": 60_000, "context_length": 8192})


# ---------------------------------------------------------------------------------------------
# canary: the repeat before the flush must reuse the whole prompt less its last token, in blocks
# ---------------------------------------------------------------------------------------------
class _ScriptedAdapter(EngineAdapter):
    """Answers the canary's three requests with scripted cached-token counts."""

    name = "scripted"

    def __init__(self, cached: list[int], block_size: int) -> None:
        super().__init__(block_size=block_size)
        self.cached = list(cached)

    def launch_command(self, cell: Any, **kw: Any) -> Any:  # pragma: no cover - never launched
        raise NotImplementedError

    async def complete(self, http: Any, base_url: str, prompt: np.ndarray, max_tokens: int, model_name: str, *, timeout: float = 600.0) -> ParsedTurn:
        return ParsedTurn(np.zeros(max_tokens, np.int32), len(prompt), self.cached.pop(0), max_tokens)

    async def flush_cache(self, http: Any, base_url: str, *, timeout: float = 60.0) -> None:
        return None


@pytest.mark.parametrize("bs", [1, 16, 32])
def test_canary_threshold_is_the_registered_one(bs: int) -> None:
    """Before the flush the repeat must reuse >= 1024 - block - 1 (the registered rule); a working
    cache reuses the whole prefix minus the last token (1023, 1008, 992), which passes."""
    full = expected_cached(1024, bs)
    floor = 1024 - bs - 1

    async def go(before: int) -> Any:
        return await canary(_ScriptedAdapter([0, before, 0], bs), "http://unused", model_name="m", http=object(), leave_empty=False)  # type: ignore[arg-type]

    ok = asyncio.run(go(full))
    assert ok.passed and ok.min_before == floor and full >= floor
    assert asyncio.run(go(floor)).passed
    short = asyncio.run(go(floor - 1))
    assert not short.passed and f"need >= {floor}" in short.reason


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
        from harness.client.protocol import Send

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
            ad = get_adapter("emulator", flavor="vllm", cell=_cell("vllm"))
            return await drive(client, ad, url, model_name="m", duration=duration, gauge_interval=None, handle_signals=False)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_5xx_with_dead_health_fails_the_run() -> None:
    client = _Chain(None)  # never finishes on its own: only the probe can end the drive early
    res = _drive_against(503, client, duration=20.0)
    assert res.status == FAILED and "server died" in res.reason and "503" in res.reason
    assert res.wall_seconds < 10.0
    assert client.responses and all(r.status == "error" and r.http_status == 500 for r in client.responses)


def test_5xx_with_healthy_server_is_a_per_turn_error() -> None:
    client = _Chain(3)
    res = _drive_against(200, client, duration=20.0)
    assert res.status == "COMPLETED" and res.errors == 3 and res.flagged


# ---------------------------------------------------------------------------------------------
# realrun: a cache-off (E0a) preflight against a failing server is a FAILED run, not a crash
# ---------------------------------------------------------------------------------------------
def test_cache_off_preflight_error_is_a_failed_run(tmp_path: Path) -> None:
    import yaml

    from harness.client.openloop import PlanClient
    from harness.config import WorkloadConfig
    from harness.realrun import EngineOptions, run_real
    from harness.record import RunRecorder, load_run

    cell = _cell("sglang").model_copy(update={"name": "tiny-off", "prefix_cache": False})
    path = tmp_path / "tiny-off.yaml"
    path.write_text(yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"})))
    cell = load_config(path, CellConfig)
    opts = EngineOptions(
        engine="emulator", time_scale=100.0, server_cmd=(sys.executable, "-m", "harness.emulator"), cell_ref=str(path),
        extra_args=("--fault", "5xx:1", "--log-level", "WARNING"), health_timeout=30.0, smoke=False,
    )  # fmt: skip
    run_dir = tmp_path / "run"
    rec = RunRecorder(run_dir, {"test": "cache-off"})
    wl = WorkloadConfig(name="tiny", first_prompt=256, tool_tokens=64, decode_tokens=8)
    res = run_real(PlanClient([], wl, sink=rec), cell=cell, options=opts, run_dir=run_dir, recorder=rec, duration=10.0)
    rec.close(res.status, res.reason)
    assert res.status == FAILED and "pre-run check failed" in res.reason and "cache-off check" in res.reason
    assert load_run(run_dir).meta["status"] == FAILED


# ---------------------------------------------------------------------------------------------
# emulator adapter: the engine clock runs at exactly the driver's time scale
# ---------------------------------------------------------------------------------------------
def test_emulator_time_scale_is_passed_exactly() -> None:
    cell = _cell("sglang")
    for scale in (4.0, 100.0, 123.456789, 1 / 3):
        argv, _ = get_adapter("emulator", cell=cell, time_scale=scale).launch_command(cell, model="m", host="127.0.0.1", port=9)
        assert float(argv[argv.index("--time-scale") + 1]) == scale
