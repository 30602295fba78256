"""The emulator speaks each engine's dialect in the fields the harness reads.

Each test runs an emulator in-process on 127.0.0.1 (an ephemeral port) at a high time scale.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aiohttp
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.emulator_fixture import D, complete, emulator, ids, run, small_cell

from harness.config import CellConfig
from harness.emulator.server import Faults
from harness.servers import get_adapter

pytestmark = [pytest.mark.timeout(60), pytest.mark.wallclock]  # wall-clock drives: one rerun if a try is late


# ---------------------------------------------------------------------------------------------
def test_sglang_completion_shape_and_hits() -> None:
    async def go() -> None:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            p1 = ids(256)
            st, r1 = await complete(http, url, p1)
            assert st == 200
            assert r1["object"] == "text_completion"
            ch = r1["choices"][0]
            assert len(ch["token_ids"]) == D and ch["prompt_token_ids"] == p1 and ch["finish_reason"] == "length"
            assert r1["usage"]["prompt_tokens"] == 256 and r1["usage"]["completion_tokens"] == D
            assert r1["usage"]["total_tokens"] == 256 + D
            # SGLang 0.5.22 with --enable-cache-report reports the details also at zero hits
            assert r1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            assert r1["metadata"] == {
                "weight_version": "default",
                "weight_versions": [{"version": "default", "start": 0, "end": D}],
            }
            p2 = p1 + ch["token_ids"] + ids(64, seed=1)
            st, r2 = await complete(http, url, p2)
            assert st == 200
            # everything but the last output token (its KV was never computed)
            assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == 256 + D - 1
            # the same prompt again: at most len - 1 (the last token is always recomputed)
            st, r3 = await complete(http, url, p2)
            assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p2) - 1

    run(go())


def test_vllm_completion_shape_and_whole_blocks() -> None:
    async def go() -> None:
        async with emulator("vllm") as (emu, url), aiohttp.ClientSession() as http:
            bs = emu.cell.page_size
            p1 = ids(250)
            st, r1 = await complete(http, url, p1)
            assert st == 200
            assert r1["usage"]["prompt_tokens_details"] == {
                "cached_tokens": 0,
                "created_cache_tokens": None,
                "multimodal_tokens": None,
            }  # always there
            assert r1["usage"]["completion_tokens_details"] is None
            ch = r1["choices"][0]
            assert len(ch["token_ids"]) == D and ch["prompt_token_ids"] == p1 and "stop_reason" in ch
            p2 = p1 + ch["token_ids"] + ids(64, seed=2)
            _, r2 = await complete(http, url, p2)
            assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == (250 + D - 1) // bs * bs
            _, r3 = await complete(http, url, p2)
            assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == (len(p2) - 1) // bs * bs

    run(go())


def test_adapters_parse_emulator_replies() -> None:
    """Part (a)'s adapters read the emulator exactly as they read the engines."""

    async def go() -> None:
        for flavor in ("sglang", "vllm"):
            async with emulator(flavor) as (emu, url), aiohttp.ClientSession() as http:
                ad = get_adapter("emulator", flavor=flavor, cell=emu.cell)
                path, body = ad.completion_request(np.asarray(ids(300), dtype=np.int32), D, "tiny")
                async with http.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
                    parsed = ad.parse_completion(r.status, await r.read())
                assert parsed.prompt_tokens == 300 and parsed.cached_tokens == 0 and parsed.completion_tokens == D
                assert parsed.output_ids.shape == (D,)
                m = await ad.scrape_metrics(http, url)
                assert m["prompt_tokens_total"] == 300 and m["generation_tokens_total"] == D
                assert m["pool_tokens"] == 20_000 or flavor == "vllm"
                await ad.flush_cache(http, url, timeout=5.0)

    run(go())


def test_sglang_generate_native() -> None:
    async def go() -> None:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            body = {
                "input_ids": ids(128),
                "sampling_params": {"max_new_tokens": D, "temperature": 0, "ignore_eos": True},
            }
            async with http.post(url + "/generate", json=body) as r:
                assert r.status == 200
                out = await r.json()
            assert len(out["output_ids"]) == D and isinstance(out["text"], str)
            mi = out["meta_info"]
            assert mi["prompt_tokens"] == 128 and mi["completion_tokens"] == D and mi["cached_tokens"] == 0
            assert mi["finish_reason"]["type"] == "length" and "e2e_latency" in mi

    run(go())


def test_context_overflow_is_400_in_the_engine_shape() -> None:
    async def go() -> None:
        for flavor in ("sglang", "vllm"):
            async with emulator(flavor) as (_emu, url), aiohttp.ClientSession() as http:
                st, body = await complete(http, url, ids(4097))
                assert st == 400
                msg = body["message"] if flavor == "sglang" else body["error"]["message"]
                assert "context length" in msg
                st, _ = await complete(http, url, ids(4096 - D))  # fits exactly (prompt + output)
                assert st == 200

    run(go())


def test_vllm_refuses_only_what_cannot_fit_and_cuts_max_tokens() -> None:
    """vLLM 0.32 (renderers/params.py, get_max_tokens): a prompt over the context is refused, one of
    exactly the context leaves max_tokens 0 (refused by the sampling check); a prompt and completion
    over the context are served with max_tokens cut to what is left."""

    async def go() -> None:
        async with emulator("vllm") as (_emu, url), aiohttp.ClientSession() as http:
            st, body = await complete(http, url, ids(4097))
            assert st == 400 and body["error"]["param"] == "input_tokens"
            assert body["error"]["message"].startswith(
                "This model's maximum context length is 4096 tokens. "
                "However, your prompt contains at least 4097 input tokens"
            )
            st, body = await complete(http, url, ids(4100))
            assert (
                "your prompt contains 4100 input tokens, which exceeds this limit even without any output tokens"
                in body["error"]["message"]
            )
            st, body = await complete(http, url, ids(4096))
            assert st == 400 and body["error"] == {
                "message": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            }
            st, body = await complete(http, url, ids(4090), max_tokens=16)
            assert st == 200 and body["usage"]["completion_tokens"] == 6 and len(body["choices"][0]["token_ids"]) == 6

    run(go())
    from harness.servers.vllm import VLLMAdapter

    assert VLLMAdapter().max_prompt_tokens(small_cell("vllm"), 16) == 4080  # the longest prompt given all 16 tokens


def test_sglang_refuses_at_its_three_limits() -> None:
    """SGLang 0.5.22's refusals, in its order and words (context 8192, pool 32768 measured; here
    context 4096, pool 20000): n >= context; n + max_tokens > context; n >= min(context - 1, pool - 1) - 5."""

    async def go(cell: CellConfig, cases: list[tuple[int, int, int, str]]) -> None:
        async with emulator("sglang", cell=cell) as (_emu, url), aiohttp.ClientSession() as http:
            for n, m, status, start in cases:
                st, body = await complete(http, url, ids(n), max_tokens=m)
                assert st == status, (n, m, body)
                if status == 400:
                    assert body == {
                        "object": "error",
                        "message": body["message"],
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                    assert body["message"].startswith(start), (n, m, body["message"])

    ctx = small_cell("sglang")  # context 4096, pool 20000: the margin below the context binds
    run(
        go(
            ctx,
            [
                (4096, 1, 400, "The input (4096 tokens) is longer than the model's context length (4096 tokens)."),
                (
                    4095,
                    16,
                    400,
                    "Requested token count exceeds the model's maximum context length of 4096 tokens. "
                    "You requested a total of 4111 tokens: 4095 tokens from the input messages and 16 tokens",
                ),
                (
                    4095,
                    1,
                    400,
                    "Input length (4095 tokens) exceeds the maximum allowed length (4090 tokens). "
                    "Use a shorter input or enable --allow-auto-truncate.",
                ),
                (4090, 1, 400, "Input length (4090 tokens) exceeds the maximum allowed length (4090 tokens)."),
                (4089, 1, 200, ""),
            ],
        )
    )
    pool = small_cell("sglang").model_copy(update={"kv_pool_tokens": 3000})  # here the pool binds
    run(
        go(
            pool,
            [
                (2994, 1, 400, "Input length (2994 tokens) exceeds the maximum allowed length (2994 tokens)."),
                (2993, 1, 200, ""),
            ],
        )
    )
    from harness.servers.sglang import SGLangAdapter

    assert SGLangAdapter().max_prompt_tokens(ctx, 1) == 4089 and SGLangAdapter().max_prompt_tokens(pool, 1) == 2993


def test_sglang_flush_refused_while_busy_then_waits_with_timeout() -> None:
    async def go() -> None:
        # time scale 0.2: one ~3000-token prefill takes tens of wall milliseconds or more
        async with emulator("sglang", time_scale=0.2) as (_emu, url), aiohttp.ClientSession() as http:
            p = ids(3000)
            task = asyncio.create_task(complete(http, url, p))
            await asyncio.sleep(0.02)
            async with http.post(url + "/flush_cache") as r:
                assert (
                    r.status == 400 and await r.text() == "Flush cache failed.\n"
                )  # SGLang's body when refused at once
            async with http.get(url + "/flush_cache?timeout=0") as r:  # 0 = no waiting
                assert r.status == 400 and await r.text() == "Flush cache failed.\n"
            async with http.get(url + "/flush_cache?timeout=30") as r:
                assert r.status == 200 and (await r.text()).startswith("Cache flushed.\n")
            # answered only once the request had finished: nothing runs now (the completion's own
            # reply may reach this client a moment after the flush's on a loaded machine)
            async with http.get(url + "/metrics") as r:
                running = [ln for ln in (await r.text()).splitlines() if ln.startswith("sglang:num_running_reqs")]
            assert running and all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in running), running
            st, _ = await asyncio.wait_for(task, 30)
            assert st == 200
            async with http.get(url + "/flush_cache") as r:
                assert r.status == 200
            _, again = await complete(http, url, p)
            assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # the cache was emptied

    run(go())


def test_sglang_flush_timeout_expiry_and_one_at_a_time() -> None:
    async def go() -> None:
        async with emulator("sglang", time_scale=0.05) as (_emu, url), aiohttp.ClientSession() as http:
            task = asyncio.create_task(complete(http, url, ids(3000)))
            await asyncio.sleep(0.05)
            waiting = asyncio.create_task(http.post(url + "/flush_cache?timeout=0.3"))
            await asyncio.sleep(0.05)
            async with http.post(url + "/flush_cache?timeout=5") as r:  # a second deferred flush
                assert r.status == 400 and await r.text() == "Another flush_cache is already in progress."
            async with await waiting as r:
                assert r.status == 400 and await r.text() == "Timed out waiting for idle state."
            assert not task.done()
            async with http.post(url + "/flush_cache?timeout=-1") as r:
                assert r.status == 422  # FastAPI's validation of Query(ge=0)
            task.cancel()

    run(go())

    run(go())


def test_vllm_reset_prefix_cache_reports_success_in_body() -> None:
    async def go() -> None:
        async with emulator("vllm", time_scale=0.2) as (_emu, url), aiohttp.ClientSession() as http:
            p = ids(3000)
            task = asyncio.create_task(complete(http, url, p))
            await asyncio.sleep(0.02)
            async with http.post(url + "/reset_prefix_cache") as r:
                assert r.status == 200 and (await r.json()) == {"success": False}
            await task
            async with http.post(url + "/reset_prefix_cache") as r:
                assert r.status == 200 and (await r.json()) == {"success": True}
            _, again = await complete(http, url, p)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            async with http.get(url + "/flush_cache") as r:  # SGLang's endpoint is not vLLM's
                assert r.status in (404, 405)

    run(go())


SGLANG_METRICS = {
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:kv_used_tokens",
    "sglang:kv_available_tokens",
    "sglang:kv_evictable_tokens",
    "sglang:cache_hit_rate",
    "sglang:num_used_tokens",
    "sglang:max_total_num_tokens",
    "sglang:page_size",
    "sglang:num_pages",
    "sglang:context_len",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_requests_total",
    "sglang:cached_tokens_total",
    "sglang:num_retracted_reqs",
}
VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:num_preemptions_total",
    "vllm:cache_config_info",
}


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_metrics_names_and_values(flavor: str) -> None:
    async def go() -> dict[str, float]:
        async with emulator(flavor) as (_emu, url), aiohttp.ClientSession() as http:
            p = ids(200)
            _, r1 = await complete(http, url, p)
            await complete(http, url, p + r1["choices"][0]["token_ids"] + ids(40, seed=3))
            async with http.get(url + "/metrics") as r:
                assert r.status == 200
                text = await r.text()
        samples = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if not s.name.endswith("_created"):
                    samples[s.name] = s.value
        return samples

    s = run(go())
    expected = SGLANG_METRICS if flavor == "sglang" else VLLM_METRICS
    assert expected <= set(s), sorted(expected - set(s))
    if flavor == "sglang":
        assert s["sglang:prompt_tokens_total"] == 200 + 248
        assert s["sglang:cached_tokens_total"] == 200 + D - 1
        assert s["sglang:max_total_num_tokens"] == 20_000
        assert s["sglang:num_running_reqs"] == 0
        assert s["sglang:kv_used_tokens"] + s["sglang:kv_available_tokens"] + s["sglang:kv_evictable_tokens"] == 20_000
    else:
        assert s["vllm:prefix_cache_queries_total"] == 200 + 248
        assert s["vllm:prefix_cache_hits_total"] == (200 + D - 1) // 16 * 16
        assert 0.0 <= s["vllm:kv_cache_usage_perc"] <= 1.0


def test_info_endpoints() -> None:
    async def go() -> None:
        for flavor in ("sglang", "vllm"):
            async with emulator(flavor) as (_emu, url), aiohttp.ClientSession() as http:
                async with http.get(url + "/health") as r:
                    assert r.status == 200
                async with http.get(url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == "tiny"
                for path in ("/server_info", "/get_server_info"):
                    async with http.get(url + path) as r:
                        info = await r.json()
                        assert info["emulator"] is True and info["time_scale"] == 100.0
                if flavor == "sglang":
                    assert info["max_total_num_tokens"] == 20_000 and info["page_size"] == 1
                    assert info["radix_eviction_policy"] == "lru" and info["device"] == "cuda"  # the cell's default
                    (state,) = info["internal_states"]  # one scheduler
                    assert state["page_size"] == 1 and state["max_req_input_len"] == 4090
                    async with http.get(url + "/version") as r:
                        assert r.status == 404  # SGLang 0.5.22 has no /version
                else:
                    assert info["block_size"] == 16 and info["num_gpu_blocks"] == 20_000 // 16

    run(go())


def test_streaming_completion_sse() -> None:
    async def go() -> None:
        async with emulator("vllm") as (_emu, url), aiohttp.ClientSession() as http:
            body = {
                "model": "tiny",
                "prompt": ids(100),
                "max_tokens": D,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with http.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                raw = (await r.read()).decode()
        events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["text"]
        assert chunks[-1]["usage"]["completion_tokens"] == D and chunks[-1]["choices"] == []

    run(go())


def test_text_prompt_uses_test_vocabulary() -> None:
    async def go() -> None:
        async with emulator("sglang") as (_emu, url), aiohttp.ClientSession() as http:
            st, r = await complete(http, url, " ".join(f"w{i}" for i in range(10, 60)))  # type: ignore[arg-type]
            assert st == 200 and r["usage"]["prompt_tokens"] == 50

    run(go())


def test_fault_parsing() -> None:
    f = Faults.parse(["5xx:3", "hang:7", "die-after:10", "unhealthy"])
    assert (f.every_5xx, f.every_hang, f.die_after, f.unhealthy) == (3, 7, 10, True)
    with pytest.raises(ValueError):
        Faults.parse(["explode:1"])
    with pytest.raises(ValueError):
        Faults.parse(["5xx:0"])


def test_cli_serves_and_reports_port_in_use() -> None:
    """`python -m harness.emulator serve` is what the emulator adapter launches."""
    from harness.servers import free_port

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "harness.emulator",
        "serve",
        "--cell",
        "sglang-a100-300k",
        "--time-scale",
        "50",
        "--port",
        str(port),
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                # SGLang answers /health after a second (so does the emulator): a 1 s timeout races it
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "emulator never became healthy"
                time.sleep(0.1)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert second.returncode == 3 and "already in use" in second.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
