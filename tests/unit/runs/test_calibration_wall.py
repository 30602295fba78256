"""Calibration stages on a real server: the same closed client, driven in wall time over HTTP.

The server is our emulator launched by its engine adapter (a subprocess on 127.0.0.1), at a time
scale that makes a few hundred plan seconds take a few wall seconds. A cache-off run must refuse a
server whose prefix cache is on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness.config import CellConfig, WorkloadConfig, load_config
from harness.emulator.server import Emulator, serve
from harness.recording.record import load_run
from runs.closed_runs import cache_off, e0a, run_closed
from runs.realrun import EngineOptions

pytestmark = [pytest.mark.timeout(120), pytest.mark.wallclock]  # wall-clock drives: one rerun if a try is late

WL = WorkloadConfig(name="tiny", first_prompt=256, tool_tokens=64, decode_tokens=8)


def tiny_cell() -> CellConfig:
    base = load_config("cells/sglang-a100-300k", CellConfig)
    return base.model_copy(update={"kv_pool_tokens": 20_000, "context_length": 8192})


def test_e0a_on_a_launched_emulator_matches_its_own_cache_off_check(tmp_path: Path) -> None:
    opts = EngineOptions(engine="emulator", time_scale=40.0, health_timeout=60.0)
    summary = e0a(
        tiny_cell(), WL, seeds=(0,), n=4, check_n=None, out_dir=tmp_path, warmup=40.0, window=160.0, engine=opts
    )
    assert summary.seeds == 1 and summary.all_miss_token_rate > 0 and summary.lambda_ref > 0
    run = load_run(tmp_path / "e0a-n4-s0")
    assert run.meta["status"] == "COMPLETED"
    assert run.meta["preflight"]["cache_off"]["repeat_cached_tokens"] == 0
    assert run.meta["engine_launch"]["argv"][-1] != ""  # the launch command is on record
    ok = run.turns[run.turns["status"] == "ok"]
    assert len(ok) > 10 and (ok["cached_tokens"] == 0).all()  # cache off: nothing is reused
    assert (run.gauges["time"].diff().dropna() > 0).all()  # gauges were scraped over the run


def test_cache_off_run_refuses_a_server_whose_cache_is_on(tmp_path: Path) -> None:
    """A cell that says 'cache off' attached to a cache-on server must fail before any load."""

    async def go() -> str:
        emu = Emulator(tiny_cell(), flavor="sglang", time_scale=40.0, model_name=tiny_cell().model)
        runner, url = await serve(emu, "127.0.0.1", 0)
        try:
            opts = EngineOptions(engine="emulator", base_url=url)
            with pytest.raises(RuntimeError) as exc:
                await asyncio.to_thread(
                    run_closed,
                    cache_off(tiny_cell()),
                    WL,
                    2,
                    warmup=5.0,
                    window=10.0,
                    run_dir=tmp_path / "r",
                    engine=opts,
                )
            return str(exc.value)
        finally:
            await runner.cleanup()

    reason = asyncio.run(go())
    assert "FAILED" in reason and "prefix cache is not off" in reason
    assert load_run(tmp_path / "r").meta["status"] == "FAILED"


def test_e0b_on_a_launched_emulator(tmp_path: Path) -> None:
    """E0b on a real server: a fresh emulator per run, the frozen plan played in wall time."""
    from runs.from_empty import e0b

    opts = EngineOptions(engine="emulator", time_scale=40.0, health_timeout=60.0)
    stats = e0b(tiny_cell(), WL, 0.2, grid=(0.5,), duration=200.0, rise_span=100.0, out_dir=tmp_path, engine=opts)
    assert len(stats) == 1 and stats[0].sessions > 0 and stats[0].stable
    run = load_run(tmp_path / "e0b-m0.5-s0")
    assert run.meta["status"] == "COMPLETED" and run.meta["run_kind"] == "from_empty"
    assert run.meta["plan"]["sha256"] and (tmp_path / "e0b-m0.5-s0" / "plan.parquet").is_file()
    assert len(run.sessions) == stats[0].sessions
