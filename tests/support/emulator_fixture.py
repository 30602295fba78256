"""An in-process emulator for the unit tests of its API (tests/unit/harness/test_emulator_*.py): on
127.0.0.1 at an ephemeral port, at a high time scale, with SGLang's 1 s health answers and warm-up
off unless asked for, and the requests those tests send."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import orjson

from harness.config import CellConfig, load_config
from harness.emulator.server import Emulator, Faults, serve

D = 8  # output tokens per request in these tests


def small_cell(flavor: str) -> CellConfig:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    return base.model_copy(update={"kv_pool_tokens": 20_000, "context_length": 4096})


@contextlib.asynccontextmanager
async def emulator(
    flavor: str, *, time_scale: float = 100.0, faults: Faults | None = None, cell: CellConfig | None = None, **kw: Any
) -> AsyncIterator[tuple[Emulator, str]]:
    """An in-process emulator; SGLang's 1 s health answers and warm-up are off unless asked for."""
    kw = {"health_poll": 0.0, "warmup": 0.0, **kw}
    emu = Emulator(
        cell or small_cell(flavor), flavor=flavor, time_scale=time_scale, model_name="tiny", faults=faults, **kw
    )
    runner, url = await serve(emu, "127.0.0.1", 0)
    try:
        yield emu, url
    finally:
        await runner.cleanup()


def ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(4, 32000, size=n).tolist()


async def complete(
    http: aiohttp.ClientSession, url: str, prompt: list[int], **extra: Any
) -> tuple[int, dict[str, Any]]:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": D,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }
    async with http.post(
        url + "/v1/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    ) as r:
        return r.status, orjson.loads(await r.read())


def run(coro: Any) -> Any:
    return asyncio.run(coro)
