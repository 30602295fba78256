"""The emulator's SGLang dialect answers as the real SGLang 0.5.22 did where it differs from what
our code first assumed (docs/sglang-cpu.md, "Differences from what our code assumes"): counters and
their labels, streaming counts, the cache hit rate, whole-page hits, health, meta_info, retractions.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.emulator_fixture import D, complete, emulator, ids, run, small_cell

from harness.config import CellConfig
from harness.servers import get_adapter

pytestmark = [pytest.mark.timeout(60), pytest.mark.wallclock]  # wall-clock drives: one rerun if a try is late


# ---------------------------------------------------------------------------------------------
# SGLang 0.5.22 as measured (docs/sglang-cpu.md, "Differences from what our code assumes")
# ---------------------------------------------------------------------------------------------
async def _samples(http: aiohttp.ClientSession, url: str) -> list[Any]:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples if not s.name.endswith("_created")]


def test_sglang_counters_appear_once_incremented_with_their_labels() -> None:
    """cached_tokens_total is absent until the first hit (and for good with the radix cache off);
    the retraction counter is absent, its per-report gauge is 0 with a pid; scheduler gauges and
    tokenizer counters carry SGLang's label sets; the mapped column is 0, not missing."""

    async def go(cell: CellConfig) -> tuple[list[Any], list[Any], dict[str, float]]:
        async with emulator("sglang", cell=cell) as (emu, url), aiohttp.ClientSession() as http:
            before = await _samples(http, url)
            p = ids(200)
            await complete(http, url, p)
            first = await _samples(http, url)
            mapped = await get_adapter("emulator:sglang", cell=emu.cell).scrape_metrics(http, url)
            await complete(http, url, p)
            return before, first, mapped, await _samples(http, url)  # type: ignore[return-value]

    before, first, mapped, after = run(go(small_cell("sglang")))
    names = lambda ss: {s.name for s in ss}  # noqa: E731
    assert "sglang:prompt_tokens_total" not in names(before)  # no request finished yet
    assert "sglang:cached_tokens_total" not in names(first) and "sglang:prompt_tokens_total" in names(first)
    assert (
        mapped["cached_tokens_total"] == 0.0
        and mapped["prompt_tokens_total"] == 200
        and mapped["preemptions_total"] == 0.0
    )
    assert "sglang:num_retracted_requests_total" not in names(after)
    by = {s.name: s for s in after}
    assert by["sglang:cached_tokens_total"].value == 199
    assert by["sglang:cached_tokens_total"].labels == {
        "cache_source": "device",
        "engine_type": "unified",
        "model_name": "tiny",
    }
    assert by["sglang:prompt_tokens_total"].labels == {
        "engine_type": "unified",
        "is_streaming": "false",
        "model_name": "tiny",
    }
    assert by["sglang:num_running_reqs"].labels == {
        "engine_type": "unified",
        "model_name": "tiny",
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    assert set(by["sglang:num_retracted_reqs"].labels) == {
        "engine_type",
        "model_name",
        "moe_ep_rank",
        "pid",
        "pp_rank",
        "tp_rank",
    }
    assert by["sglang:num_retracted_reqs"].value == 0
    assert by["sglang:num_pages"].value == 20_000 and by["sglang:context_len"].value == 4096

    off = small_cell("sglang").model_copy(update={"prefix_cache": False})
    _, _, mapped_off, after_off = run(go(off))
    assert "sglang:cached_tokens_total" not in names(after_off) and mapped_off["cached_tokens_total"] == 0.0


def test_sglang_streaming_counts_apart_and_one_chunk_per_token() -> None:
    async def go() -> tuple[list[Any], list[Any]]:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            prompt = ids(30)
            body = {
                "model": "tiny",
                "prompt": prompt,
                "max_tokens": 4,
                "ignore_eos": True,
                "return_token_ids": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with http.post(url + "/v1/completions", json=body) as r:
                raw = (await r.read()).decode()
            await complete(http, url, ids(50, seed=4))
            events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "[DONE]"
            return [orjson.loads(e) for e in events[:-1]], await _samples(http, url)

    chunks, samples = run(go())
    tokens = chunks[:-1]
    assert len(tokens) == 4 and all(len(c["choices"][0]["token_ids"]) == 1 and c["usage"] is None for c in tokens)
    assert all("matched_stop" in c["choices"][0] for c in tokens)
    assert "prompt_token_ids" in tokens[0]["choices"][0] and all(
        "prompt_token_ids" not in c["choices"][0] for c in tokens[1:]
    )
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    prompt = {s.labels["is_streaming"]: s.value for s in samples if s.name == "sglang:prompt_tokens_total"}
    assert prompt == {"true": 30, "false": 50}


def test_sglang_cache_hit_rate_is_the_latest_batchs() -> None:
    """sglang:cache_hit_rate is the hit ratio of the latest prefill batch, not the cumulative one."""

    async def go() -> tuple[float, float]:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            p = ids(400)
            await complete(http, url, p)
            await complete(http, url, p)  # 399 of 400 reused
            hit = {s.name: s.value for s in await _samples(http, url)}["sglang:cache_hit_rate"]
            await complete(http, url, ids(100, seed=9))  # a miss
            miss = {s.name: s.value for s in await _samples(http, url)}["sglang:cache_hit_rate"]
            return hit, miss

    hit, miss = run(go())
    assert hit == pytest.approx(399 / 400) and miss == 0.0  # cumulative would be 399 / 900


def test_sglang_page_32_hits_whole_pages() -> None:
    """With 32-token pages a follow-up reuses floor((prev prompt + output - 1) / 32) pages, as the
    real server did (2000 + 100 -> 2080, a repeat of 1024 -> 992, of 32 -> 0)."""
    cell = small_cell("sglang").model_copy(update={"page_size": 32, "kv_pool_tokens": 20_000 // 32 * 32})

    async def go() -> list[int]:
        async with emulator("sglang", cell=cell) as (_emu, url), aiohttp.ClientSession() as http:
            out = []
            for n in (32, 33, 100, 1024):
                p = ids(n, seed=n)
                await complete(http, url, p)
                _, r = await complete(http, url, p)
                out.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
            p = ids(2000, seed=1)
            _, r1 = await complete(http, url, p, max_tokens=100)
            _, r2 = await complete(http, url, p + r1["choices"][0]["token_ids"] + ids(550, seed=2), max_tokens=100)
            out.append(r2["usage"]["prompt_tokens_details"]["cached_tokens"])
            return out

    assert run(go()) == [0, 32, 96, 992, 2080]


def test_sglang_health_warms_up_then_answers_after_its_poll() -> None:
    async def go() -> tuple[int, int, float]:
        async with emulator("sglang", warmup=0.3, health_poll=0.2) as (_emu, url), aiohttp.ClientSession() as http:
            async with http.get(url + "/health") as r:
                early = r.status
            await asyncio.sleep(0.35)
            t0 = time.monotonic()
            async with http.get(url + "/health") as r:
                late = r.status
            return early, late, time.monotonic() - t0

    early, late, secs = run(go())
    assert early == 503 and late == 200 and secs >= 0.19
    from harness.emulator.core import HEALTH_POLL, WARMUP

    assert HEALTH_POLL == {"sglang": 1.0, "vllm": 0.0} and WARMUP["sglang"] > 0 and WARMUP["vllm"] == 0


def test_sglang_generate_meta_info_keys() -> None:
    async def go() -> dict[str, Any]:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            body = {
                "input_ids": ids(120),
                "sampling_params": {"max_new_tokens": D, "temperature": 0, "ignore_eos": True},
            }
            async with http.post(url + "/generate", json=body) as r:
                return (await r.json())["meta_info"]

    mi = run(go())
    for key in (
        "queue_time",
        "first_token_latency",
        "cached_tokens_details",
        "weight_version",
        "weight_versions",
        "num_retractions",
        "request_received_ts",
        "request_finished_ts",
        "reasoning_tokens",
        "dp_rank",
    ):
        assert key in mi, key
    assert mi["cached_tokens_details"] is None and mi["request_finished_ts"] >= mi["request_received_ts"]


def test_sglang_collector_exports_retractions_once_counted() -> None:
    from harness.emulator.flavors import EngineCollector

    cell = small_cell("sglang")
    snap: dict[str, Any] = {"pool_tokens": 20_000.0, "preemptions_total": 0.0, "retracted_report": 0.0, "pid": 7}
    col = EngineCollector("sglang", "tiny", cell, lambda: dict(snap))
    names = lambda: {s.name: s.value for fam in col.collect() for s in fam.samples}  # noqa: E731
    assert "sglang:num_retracted_requests_total" not in names()
    snap.update(preemptions_total=3.0, retracted_report=2.0)
    assert names()["sglang:num_retracted_requests_total"] == 3.0 and names()["sglang:num_retracted_reqs"] == 2.0
