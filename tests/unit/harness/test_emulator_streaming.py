"""The emulator streams like an engine: each token leaves when the engine model's iteration that
produced it ends, so a client measures the model's first-token time and decode steps (a third-party
benchmark client's TTFT and TPOT then mean what they say); the usage chunk's vLLM metrics and
SGLang's /generate meta_info carry the model's own queue, first-token and decode times.

Tolerance: the emulator may run an iteration up to 1 ms early (its clock lead) and the loopback HTTP
path adds a few ms, on a shared machine more; each iteration here costs 30 ms or more, so means are
compared within 15% (plus 15 ms for the first token, whose time includes reading a
1000-id prompt: 2-12 ms measured here on a shared machine)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from support.emulator_fixture import emulator, ids, run, small_cell

pytestmark = pytest.mark.wallclock  # wall-clock timings: one rerun if a try is late (tests/conftest.py)

COST = {"a": 0.03, "f0": 0.0, "b": 20e-6, "c_p": 0.0, "chunk": 8192, "c_d": 0.0, "speed": 1.0, "token_factor": 1.0}
PROMPT, D = 1000, 12


def _cell(flavor: str) -> Any:
    return small_cell(flavor).model_copy(update={"cost": small_cell(flavor).cost.model_validate(COST)})


async def _stream(http: aiohttp.ClientSession, url: str, prompt: list[int]) -> tuple[float, list[float], list[Any]]:
    """(time to the first token chunk, the gaps between token chunks, every chunk), measured here."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": D, "ignore_eos": True, "return_token_ids": True}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, chunks = [], []
    async with http.post(url + "/v1/completions", data=orjson.dumps(body)) as r:
        assert r.status == 200
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            c = orjson.loads(line[6:])
            chunks.append(c)
            if c["choices"]:
                stamps.append(time.perf_counter())
    gaps = list(np.diff(stamps))
    return stamps[0] - t0, gaps, chunks


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_tokens_leave_at_the_models_decode_steps(flavor: str) -> None:
    cell = _cell(flavor)
    cost = cell.cost.model()
    prefill = cost.prefill_iteration(PROMPT, 0.0)  # one request alone: one prefill chunk
    step = cost.decode_time(1, 0.0)  # c_d = 0: every decode step of one request costs the same

    async def go() -> tuple[float, list[float], list[Any]]:
        async with emulator(flavor, time_scale=1.0, cell=cell) as (_emu, url), aiohttp.ClientSession() as http:
            await _stream(http, url, ids(PROMPT, seed=1))  # warm the path
            return await _stream(http, url, ids(PROMPT, seed=2))

    ttft, gaps, chunks = run(go())
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == D and [len(c["choices"][0]["token_ids"]) for c in tokens] == [1] * D
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * (D - 1) + ["length"]
    # the first token after the prefill iteration, not after the whole completion
    assert ttft == pytest.approx(prefill, rel=0.15, abs=0.015)
    assert ttft < prefill + (D - 1) * step / 2
    # tokens one decode step apart: TPOT > 0 and the model's
    assert len(gaps) == D - 1 and min(gaps) > 0.5 * step
    assert float(np.mean(gaps)) == pytest.approx(step, rel=0.15)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == D
    if flavor == "vllm":  # the model's own times, as vLLM's --enable-per-request-metrics reports them
        # (the engine clock: an iteration starts when the emulator's loop gets to it, so a late
        # wake-up shows in the model's times and in the client's alike)
        m = usage["metrics"]
        assert m["time_to_first_token_ms"] == pytest.approx(prefill * 1e3, rel=0.15)
        assert m["generation_time_ms"] == pytest.approx(sum(gaps) * 1e3, rel=0.10, abs=5.0)
        assert m["mean_itl_ms"] == pytest.approx(step * 1e3, rel=0.15) and m["queue_time_ms"] == pytest.approx(0, abs=5)
    else:
        assert "metrics" not in usage  # SGLang's stream carries no timings


def test_sglang_generate_meta_info_carries_the_models_timings() -> None:
    cell = _cell("sglang")
    cost = cell.cost.model()
    prefill, step = cost.prefill_iteration(PROMPT, 0.0), cost.decode_time(1, 0.0)

    async def go() -> dict[str, Any]:
        async with emulator("sglang", time_scale=1.0, cell=cell) as (_emu, url), aiohttp.ClientSession() as http:
            body = {"input_ids": ids(PROMPT), "sampling_params": {"max_new_tokens": D, "ignore_eos": True}}
            async with http.post(url + "/generate", data=orjson.dumps(body)) as r:
                out: dict[str, Any] = orjson.loads(await r.read())["meta_info"]
                return out

    m = run(go())
    assert m["queue_time"] == pytest.approx(0.0, abs=5e-3)
    assert m["prefill_finished_time"] - m["forward_entry_time"] == pytest.approx(prefill, rel=0.15)
    assert m["request_finished_ts"] - m["prefill_finished_time"] == pytest.approx((D - 1) * step, rel=0.15)
    assert m["first_token_latency"] == pytest.approx(prefill, rel=0.15, abs=0.015)
    assert m["e2e_latency"] == pytest.approx(prefill + (D - 1) * step, rel=0.15)


def test_a_refused_stream_gets_the_plain_error() -> None:
    async def go() -> tuple[int, str]:
        async with emulator("vllm") as (_emu, url), aiohttp.ClientSession() as http:
            body = {"model": "tiny", "prompt": ids(5000), "max_tokens": 4, "stream": True}
            async with http.post(url + "/v1/completions", data=orjson.dumps(body)) as r:
                return r.status, r.headers["Content-Type"]

    status, ctype = run(go())
    assert status == 400 and ctype.startswith("application/json")


def test_sglang_generate_refusal_is_the_native_envelope() -> None:
    # SGLang 0.5.22's /generate answered a prompt over the context with {"error": {"message"}} (checked here)
    async def go() -> tuple[int, Any]:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            body = {"input_ids": ids(5000), "sampling_params": {"max_new_tokens": 4}}
            async with http.post(url + "/generate", data=orjson.dumps(body)) as r:
                return r.status, orjson.loads(await r.read())

    status, body = run(go())
    assert status == 400 and body == {
        "error": {"message": "The input (5000 tokens) is longer than the model's context length (4096 tokens)."}
    }
