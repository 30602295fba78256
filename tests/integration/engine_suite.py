"""The integration cases every engine runs: real vLLM, real SGLang, and the emulator in both dialects.

Each case takes a `Live` server (live_engines.py) and checks a fact the experiment rests on:
Stage 0 smoke, the canary around a flush, a flush refused while a request runs, the gauges, an
open-loop run whose follow-ups hit exactly as the prefix cache predicts, the run command and a
Stage C calibration against the running server, and the faults (a hung server, SIGTERM to the
client of a run, a server that dies mid-run). The cases are split by job: this module's
(the server's own facts, and the helpers every case uses), engine_runs.py's (runs against the
running server) and engine_faults.py's (the faults); tests/integration/test_engines_real.py runs
every one on every engine. The expected values below are the facts measured on the real engines
(docs/sglang-cpu.md, the vLLM notes in the module docstrings), not recomputed from our code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import orjson
from live_engines import CONTEXT, POOL, D, Live

from harness.config import WorkloadConfig
from harness.servers.keepalive import engine_session
from harness.servers.metrics import COMMON_METRICS, parse_prometheus
from harness.servers.smoke import canary, expected_cached, run_smoke

# Longest prompt accepted with max_tokens 1 by the 8,192-token context (pool 32,768), measured:
# vLLM: the prompt and its completion fit the context; SGLang: its scheduler refuses
# n >= min(context - 1, pool - 1) - 5, so 8,185 is the longest (8,191 got a 400).
LONGEST_PROMPT = {"vllm": CONTEXT - 1, "sglang": CONTEXT - 7}
# What each engine answers to a flush while a request runs (measured on SGLang 0.5.22 and vLLM 0.32).
FLUSH_REFUSED = {"sglang": (400, b"Flush cache failed.\n"), "vllm": (200, b'{"success":false}')}
# Prompt and decode tokens of the request a flush is sent under, by engine. While the CPU vLLM
# decodes, its API server can fall behind the engine's outputs and answer nothing else until the
# request ends (test_engine_flush.py, which runs the real vLLM's case alone for that reason). Its
# request decodes 7,000 tokens (1,000 + 7,000 within the 8,192 context, ~35 s), far longer than
# the 0.7-1.2 s it took to be seen running on a quiet machine, and the client leaves it once the
# flush is answered (vLLM aborts it) rather than waiting for its end.
FLUSH_REQUEST = {
    "vllm": (1000, 7000),
    "emulator:vllm": (3000, 1024),
    "sglang": (3000, 64),
    "emulator:sglang": (3000, 64),
}
FLUSH_TRIES = 5
# Plan seconds a fixed-horizon run gets, per engine: the real SGLang serves the tiny model 10-25x
# slower than vLLM on this CPU (torch-native attention, Python decode steps of 0.1-1.6 s on a loaded
# 2-core machine), so its first turns can take longer than a vLLM run lasts.
HORIZON_FACTOR = {"sglang": 2.5}


def horizon(live: Live, seconds: float) -> float:
    return seconds * HORIZON_FACTOR.get(live.engine, 1.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def with_http(fn: Callable[[aiohttp.ClientSession], Any]) -> Any:
    async with engine_session() as http:  # idle connections closed before the server's timer
        return await fn(http)


def tag(live: Live, text: str) -> None:
    print(f"[{live.engine}] " + text.replace("\n", f"\n[{live.engine}] "))


def ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 32000, size=n, dtype=np.int32)


def sessions(workload: WorkloadConfig, n: int, rate: float, seed: int) -> list[Any]:
    from harness.workload.draws import STREAM_BASE, draw_session

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [draw_session(workload, seed, STREAM_BASE, i, float(t)) for i, t in enumerate(arrivals)]


def check_follow_ups(turns: Any, block: int, workload: WorkloadConfig) -> int:
    """Every follow-up reuses exactly the previous prompt and output but its last token, in whole
    pages; a first turn reuses (almost) nothing. Returns the number of follow-ups checked."""
    follow = 0
    for _sid, g in turns.sort_values(["session", "turn"]).groupby("session"):
        g = g[g["status"] == "ok"].reset_index(drop=True)
        if not len(g) or int(g.loc[0, "turn"]) != 1:
            continue
        # A fresh session shares nothing but, with 1-token pages, a chance equal first token or two
        # with another random prompt (a real SGLang matches those too).
        assert g.loc[0, "cached_tokens"] < max(block, 3)
        for k in range(1, len(g)):
            if int(g.loc[k, "turn"]) != int(g.loc[k - 1, "turn"]) + 1:
                break
            prev = int(g.loc[k - 1, "prompt_tokens"])
            assert g.loc[k, "prompt_tokens"] == prev + D + workload.tool_tokens
            assert g.loc[k, "cached_tokens"] == expected_cached(prev + D, block), (
                k,
                prev,
                int(g.loc[k, "cached_tokens"]),
            )
            follow += 1
    return follow


# ---------------------------------------------------------------------------------------------
# Stage 0, canary, flush, gauges
# ---------------------------------------------------------------------------------------------
def case_cached_counter_before_first_hit(live: Live) -> None:
    """The cumulative cached-token column is 0 before any hit, not missing: SGLang exports
    sglang:cached_tokens_total only from its first hit on (a labelled counter), vLLM from the start."""

    async def go(http: aiohttp.ClientSession) -> tuple[set[str], dict[str, float], dict[str, float]]:
        p = ids(96, seed=101)
        await live.adapter.complete(http, live.url, p, 1, live.model_name)
        async with http.get(live.url + "/metrics") as r:
            names = {s.name for s in parse_prometheus(await r.text())}
        before = await live.adapter.scrape_metrics(http, live.url)
        again = await live.adapter.complete(http, live.url, p, 1, live.model_name)
        assert again.cached_tokens == expected_cached(96, live.block)
        return names, before, await live.adapter.scrape_metrics(http, live.url)

    names, before, after = run(with_http(go))
    tag(
        live,
        f"before the first hit: cached_tokens_total {before.get('cached_tokens_total')}, "
        f"after: {after.get('cached_tokens_total')}",
    )
    if live.flavor == "sglang":
        assert "sglang:cached_tokens_total" not in names and "sglang:prompt_tokens_total" in names
    assert before["cached_tokens_total"] == 0.0 and before["prompt_tokens_total"] >= 96
    assert after["cached_tokens_total"] == expected_cached(96, live.block)


def case_smoke(live: Live) -> None:
    report = run(run_smoke(live.adapter, live.url, live.cell, model_name=live.model_name, launched_argv=[]))
    tag(live, report.summary())
    assert report.passed, report.reason
    flags = report.check("flags_accepted").detail
    assert flags["mismatched"] == 0 and flags["unreported"] == "-", flags  # every setting was read back
    assert report.check("cached_tokens_reported").detail["repeat"] == expected_cached(64, live.block)
    assert report.check("output_ids_returned").detail["returned_ids"] == 100
    long = report.check("long_context_accepted").detail
    assert long["sent"] == LONGEST_PROMPT[live.flavor] and long["capped"]  # documented: the tiny server's limit
    assert report.check("pool_size").detail["reported"] == POOL
    assert report.check("prompt_length_agreement").detail["mismatches"] == 0
    assert report.canary is not None and report.canary.after == 0
    json.dumps(report.to_dict(), default=str)  # the report is what a run's meta.json records


# (prompt tokens, max_tokens) -> (status, message start, completion tokens) at context 8,192 and
# pool 32,768, as the engines answered: SGLang refuses three ways (docs/sglang-cpu.md, "Length
# limits"); vLLM 0.32 refuses a prompt over the context, and one of exactly the context (its
# max_tokens is cut to 0), and serves a prompt and completion over the context with max_tokens cut.
LENGTH_LIMITS: dict[str, list[tuple[int, int, int, str, int | None]]] = {
    "sglang": [
        (
            CONTEXT - 6,
            1,
            400,
            f"Input length ({CONTEXT - 6} tokens) exceeds the maximum allowed length ({CONTEXT - 6} tokens).",
            None,
        ),
        (
            CONTEXT - 1,
            16,
            400,
            f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. "
            f"You requested a total of {CONTEXT + 15} tokens: {CONTEXT - 1} tokens from the input messages "
            "and 16 tokens",
            None,
        ),
        (
            CONTEXT,
            1,
            400,
            f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens).",
            None,
        ),
    ],
    "vllm": [
        (
            CONTEXT + 1,
            1,
            400,
            f"This model's maximum context length is {CONTEXT} tokens. "
            f"However, your prompt contains at least {CONTEXT + 1} input tokens",
            None,
        ),
        (CONTEXT, 1, 400, "max_tokens must be at least 1, got 0.", None),
        (CONTEXT - 4, 16, 200, "", 4),
    ],
}


def case_length_limits(live: Live) -> None:
    """What the engine refuses, in its words, and what it cuts; the adapter's longest prompt is the
    longest the engine serves in full (the smoke test's long-context check sends it)."""
    assert live.adapter.max_prompt_tokens(live.cell, 1) == LONGEST_PROMPT[live.flavor]

    async def go(http: aiohttp.ClientSession) -> list[tuple[int, Any]]:
        out = []
        for n, m, *_ in LENGTH_LIMITS[live.flavor]:
            path, body = live.adapter.completion_request(ids(n, seed=5), m, live.model_name)
            async with http.post(live.url + path, data=body, headers={"Content-Type": "application/json"}) as r:
                out.append((r.status, orjson.loads(await r.read())))
        return out

    answers = run(with_http(go))
    for (n, m, status, start, completion), (got, body) in zip(LENGTH_LIMITS[live.flavor], answers):
        said = body.get("error", body.get("message")) if got != 200 else body.get("usage", body.get("meta_info"))
        tag(live, f"{n} + {m}: {got} {str(said)[:300]}")
        assert got == status, (n, m, body)
        if status == 200:
            assert (
                body["usage"]["completion_tokens"] == completion and len(body["choices"][0]["token_ids"]) == completion
            )
        elif live.flavor == "sglang":  # the adapter's /generate: {"error": {"message"}}
            assert body["error"]["message"].startswith(start), body["error"]["message"]
        else:
            assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400
            assert body["error"]["message"].startswith(start), body["error"]["message"]


def case_canary(live: Live) -> None:
    res = run(canary(live.adapter, live.url, model_name=live.model_name))
    tag(live, f"canary: {res.to_dict()}")
    assert res.passed, res.reason
    assert res.before == expected_cached(1024, live.block)  # 1023 (1-token pages), 992 (32-token pages)
    assert res.after == 0


async def _raw_flush(live: Live, http: aiohttp.ClientSession, query: str = "") -> tuple[int, bytes, float]:
    path = "/flush_cache" if live.flavor == "sglang" else "/reset_prefix_cache"
    t0 = time.monotonic()
    async with http.post(live.url + path + query, timeout=aiohttp.ClientTimeout(total=300)) as r:
        return r.status, await r.read(), time.monotonic() - t0


async def _until_running(live: Live, http: aiohttp.ClientSession, task: asyncio.Task, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not task.done():
        if (await live.adapter.scrape_metrics(http, live.url)).get("running", 0) >= 1:
            return True
        await asyncio.sleep(0.05)
    return False


def case_flush_refused_while_running(live: Live) -> None:
    """The engine refuses to flush while a request runs (SGLang: 400 at once; vLLM: 200 with
    success false). SGLang's ?timeout= then waits for the request to end, which completes in full;
    a vLLM client leaves its request instead (the real vLLM aborts it, the emulator finishes it),
    and the flush succeeds once no request holds blocks. After it the canary passes."""

    async def go(http: aiohttp.ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {"missed": []}
        size, decode = FLUSH_REQUEST[live.engine]
        for attempt in range(FLUSH_TRIES):  # a request may finish between the gauge read and the flush
            prompt = ids(size, seed=200 + attempt)
            t0 = time.monotonic()
            task = asyncio.create_task(live.adapter.complete(http, live.url, prompt, decode, live.model_name))
            if not await _until_running(live, http, task):
                await task
                out["missed"].append(f"try {attempt}: never seen running ({time.monotonic() - t0:.2f} s)")
                continue
            seen = time.monotonic() - t0
            status, body, secs = await _raw_flush(live, http)
            if task.done():
                out["missed"].append(
                    f"try {attempt}: seen running at {seen:.2f} s, the flush ({status} {body!r}) answered"
                    f" in {secs:.2f} s, after the request ended"
                )
                continue
            out["refused"] = (status, body, round(seen, 2), round(secs, 2))
            if live.flavor == "sglang":
                status, body, secs = await _raw_flush(live, http, "?timeout=300")
                out["waited"] = (status, body, secs, task.done())
                out["completion_tokens"] = (await task).completion_tokens
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            break
        t1 = time.monotonic()
        await live.adapter.flush_cache(http, live.url, timeout=120)
        out["flushed_after"] = round(time.monotonic() - t1, 2)
        out["canary"] = await canary(live.adapter, live.url, model_name=live.model_name, http=http)
        return out

    out = run(with_http(go))
    tag(live, f"flush while running: {out}")
    assert "refused" in out, f"no request was still running when the flush was answered: {out['missed']}"
    status, body, *_ = out["refused"]
    want_status, want_body = FLUSH_REFUSED[live.flavor]
    assert status == want_status and body.replace(b" ", b"") == want_body.replace(b" ", b""), (status, body)
    if live.flavor == "sglang":
        # answered once the engine was idle (the completion's own reply may reach us a moment later)
        status, body, _secs, _finished = out["waited"]
        assert status == 200 and body.startswith(b"Cache flushed."), (status, body)
        assert out["completion_tokens"] == FLUSH_REQUEST[live.engine][1]
    assert out["canary"].passed and out["canary"].after == 0, out["canary"].reason


def case_gauges_scraped_and_mapped(live: Live) -> None:
    m = run(with_http(lambda http: live.adapter.scrape_metrics(http, live.url)))
    tag(live, f"gauges: {m}")
    assert set(m) <= set(COMMON_METRICS)
    for name in (
        "running",
        "waiting",
        "pool_tokens",
        "kv_usage_frac",
        "kv_used_tokens",
        "prompt_tokens_total",
        "cached_tokens_total",
        "generation_tokens_total",
        "preemptions_total",
    ):
        assert name in m, name
    assert m["pool_tokens"] == POOL
    assert m["running"] == 0 and m["waiting"] == 0 and m["kv_used_tokens"] == 0
    assert m["prompt_tokens_total"] > 0 and m["cached_tokens_total"] > 0  # the smoke test and canary ran before
    assert m["preemptions_total"] == 0  # nothing was ever preempted on this idle, roomy pool
    if live.flavor == "sglang":
        assert "kv_evictable_tokens" in m
