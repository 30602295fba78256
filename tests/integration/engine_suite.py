"""The integration cases every engine runs: real vLLM, real SGLang, and the emulator in both dialects.

Each case takes a `Live` server (live_engines.py) and checks a fact the experiment rests on:
Stage 0 smoke, the canary around a flush, a flush refused while a request runs, the gauges, an
open-loop run whose follow-ups hit exactly as the prefix cache predicts, the run command and a
Stage C calibration against the running server, and the faults (a hung server, SIGTERM to the
client of a run, a server that dies mid-run). The test modules call these with their
own engines; the expected values below are the facts measured on the real engines
(docs/sglang-cpu.md, the vLLM notes in the module docstrings), not recomputed from our code.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import yaml
from live_engines import CONTEXT, POOL, REPO, D, Live

from harness.config import WorkloadConfig
from harness.servers.metrics import COMMON_METRICS, parse_prometheus
from harness.servers.smoke import canary, expected_cached, run_smoke

# Longest prompt accepted with max_tokens 1 by the 8,192-token context (pool 32,768), measured:
# vLLM: the prompt and its completion fit the context; SGLang: its scheduler refuses
# n >= min(context - 1, pool - 1) - 5, so 8,185 is the longest (8,191 got a 400).
LONGEST_PROMPT = {"vllm": CONTEXT - 1, "sglang": CONTEXT - 7}
# What each engine answers to a flush while a request runs (measured on SGLang 0.5.22 and vLLM 0.32).
FLUSH_REFUSED = {"sglang": (400, b"Flush cache failed.\n"), "vllm": (200, b'{"success":false}')}
# Decode tokens of the request a flush is sent under: on a quiet machine the CPU vLLM finishes 64
# tokens of the tiny model before the flush's reply comes back, so its request decodes longer.
FLUSH_DECODE = {"vllm": 512, "sglang": 64}
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
    async with aiohttp.ClientSession() as http:
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
        f"before the first hit: cached_tokens_total {before.get('cached_tokens_total')}, after: {after.get('cached_tokens_total')}",
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
            f"You requested a total of {CONTEXT + 15} tokens: {CONTEXT - 1} tokens from the input messages and 16 tokens",
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
            f"This model's maximum context length is {CONTEXT} tokens. However, your prompt contains at least {CONTEXT + 1} input tokens",
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
        tag(
            live,
            f"{n} + {m}: {got} {str(body.get('error', body.get('message')) if got != 200 else body['usage'])[:300]}",
        )
        assert got == status, (n, m, body)
        if status == 200:
            assert (
                body["usage"]["completion_tokens"] == completion and len(body["choices"][0]["token_ids"]) == completion
            )
        elif live.flavor == "sglang":
            assert body["object"] == "error" and body["code"] == 400 and body["type"] == "BadRequestError"
            assert body["message"].startswith(start), body["message"]
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
    success false); SGLang's ?timeout= waits for the request to end; after it the canary passes."""

    async def go(http: aiohttp.ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for attempt in range(FLUSH_TRIES):  # a request may finish between the gauge read and the flush
            prompt = ids(3000, seed=200 + attempt)
            task = asyncio.create_task(
                live.adapter.complete(http, live.url, prompt, FLUSH_DECODE[live.flavor], live.model_name)
            )
            if not await _until_running(live, http, task):
                await task
                continue
            status, body, _ = await _raw_flush(live, http)
            if task.done():
                continue
            out["refused"] = (status, body)
            if live.flavor == "sglang":
                status, body, secs = await _raw_flush(live, http, "?timeout=300")
                out["waited"] = (status, body, secs, task.done())
            turn = await task
            out["completion_tokens"] = turn.completion_tokens
            break
        await live.adapter.flush_cache(http, live.url, timeout=120)
        out["canary"] = await canary(live.adapter, live.url, model_name=live.model_name, http=http)
        return out

    out = run(with_http(go))
    tag(live, f"flush while running: {out}")
    assert "refused" in out, f"no request was still running when the flush was answered ({FLUSH_TRIES} tries)"
    status, body = out["refused"]
    want_status, want_body = FLUSH_REFUSED[live.flavor]
    assert status == want_status and body.replace(b" ", b"") == want_body.replace(b" ", b""), (status, body)
    if live.flavor == "sglang":
        # answered once the engine was idle (the completion's own reply may reach us a moment later)
        status, body, _secs, _finished = out["waited"]
        assert status == 200 and body.startswith(b"Cache flushed."), (status, body)
    assert out["completion_tokens"] == FLUSH_DECODE[live.flavor]
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


# ---------------------------------------------------------------------------------------------
# runs against the running server
# ---------------------------------------------------------------------------------------------
OPEN_LOOP = {
    "name": "tiny",
    "first_prompt": 256,
    "tool_tokens": 64,
    "decode_tokens": D,
    "turns": {"mean": 3.0, "cap": 5},
    "tool_time": {"mean": 0.5},
}


def case_open_loop_run(live: Live, tmp_path: Path) -> None:
    """12 sessions through the asyncio driver and the open-loop client: every follow-up reuses
    exactly the previous prompt and output, whole pages only; gauges are recorded; the flush
    then empties the cache."""
    from harness.client.openloop import PlanClient
    from harness.drivers.wall import drive
    from harness.recording.record import RunRecorder, load_run
    from harness.recording.schema import RunStatus

    workload = WorkloadConfig.model_validate(OPEN_LOOP)
    n = 12
    plan = sessions(workload, n, rate=2.0, seed=7)
    rec = RunRecorder(tmp_path / "run", {"test": "open-loop", "engine": live.engine})
    client = PlanClient(plan, workload, sink=rec)
    t0 = time.monotonic()
    result = run(
        drive(
            client,
            live.adapter,
            live.url,
            model_name=live.model_name,
            recorder=rec,
            gauge_interval=1.0,
            request_timeout=120.0,
            handle_signals=False,
        )
    )
    wall = time.monotonic() - t0
    rec.close()
    data = load_run(tmp_path / "run")
    assert result.status == RunStatus.COMPLETED, result.reason
    assert result.errors == 0 and result.timeouts == 0 and client.prompt_mismatches == 0

    turns = data.turns
    assert (turns["status"] == "ok").all()
    assert (data.sessions["outcome"] == "completed").all() and len(data.sessions) == n
    assert len(turns) == sum(s.n_turns for s in plan)
    assert (turns["n_output_ids"] == D).all()
    follow = check_follow_ups(turns, live.block, workload)
    assert follow == len(turns) - n > 0

    gauges = data.gauges
    tag(
        live,
        f"open loop: {len(turns)} turns ({follow} follow-ups) in {wall:.1f} s; {len(gauges)} gauge rows; "
        f"last {gauges.iloc[-1].to_dict() if len(gauges) else None}",
    )
    assert result.gauge_scrapes >= 2 and len(gauges) == result.gauge_scrapes
    assert (gauges["pool_tokens"] == POOL).all()
    assert gauges["running"].notna().all() and gauges["prompt_tokens_total"].is_monotonic_increasing
    assert gauges["cached_tokens_total"].iloc[-1] > 0

    async def after(http: aiohttp.ClientSession) -> tuple[Any, dict[str, float]]:
        await live.adapter.flush_cache(http, live.url, timeout=30)
        m = await live.adapter.scrape_metrics(http, live.url)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http), m

    res, m = run(with_http(after))
    assert res.passed and res.after == 0, res.reason
    if "kv_evictable_tokens" in m:
        # The run's idle KV is gone, not just the canary's: after the flush the cache holds only
        # what a probe leaves. SGLang reports its pool gauges on batches (and every 30 s when
        # idle), not per scrape, so the probe is also what makes the report fresh.
        probe = 100
        seen = run(with_http(lambda http: _evictable_after(live, http, ids(probe, seed=77))))
        assert seen[-1] == expected_cached(probe + 1, live.block), seen


async def _evictable_after(
    live: Live, http: aiohttp.ClientSession, prompt: np.ndarray, wait: float = 40.0
) -> list[float]:
    """kv_evictable_tokens as reported after one request, until it shows that request's KV."""
    await live.adapter.complete(http, live.url, prompt, 1, live.model_name)
    want = expected_cached(len(prompt) + 1, live.block)
    seen: list[float] = []
    deadline = time.monotonic() + wait
    while True:
        seen.append((await live.adapter.scrape_metrics(http, live.url))["kv_evictable_tokens"])
        if seen[-1] == want or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.5)


def case_run_real_attached(live: Live, tmp_path: Path) -> None:
    """The run command's real-engine path against the running server: smoke, canary, drive, meta."""
    from harness.client.openloop import PlanClient
    from harness.recording.record import RunRecorder, load_run
    from runs import realrun

    workload = WorkloadConfig.model_validate(
        {
            "name": "tiny",
            "first_prompt": 128,
            "tool_tokens": 32,
            "decode_tokens": D,
            "turns": {"mean": 2.0, "cap": 3},
            "tool_time": {"mean": 0.2},
        }
    )
    rec = RunRecorder(tmp_path / "run", {"test": "run_real"})
    client = PlanClient(sessions(workload, 4, rate=4.0, seed=3), workload, sink=rec)
    opts = realrun.EngineOptions(
        engine=live.engine, base_url=live.url, served_model_name=live.model_name, cell_ref=str(live.cell_path)
    )
    result = realrun.run_real(
        client, cell=live.cell, options=opts, run_dir=tmp_path / "run", recorder=rec, gauge_interval=1.0
    )
    rec.close()
    assert result.status == "COMPLETED", result.reason
    data = load_run(tmp_path / "run")
    pre = data.meta.get("preflight", {})
    assert pre.get("smoke", {}).get("passed") is True, pre
    assert pre.get("canary", {}).get("after") == 0 and pre["canary"]["before"] == expected_cached(1024, live.block), pre
    assert check_follow_ups(data.turns, live.block, workload) > 0


def _tiny_test_files(live: Live, folder: Path, *, duration: float = 10.0) -> Path:
    """A one-arm test (the server's cell, a workload, a protocol, the BURST arm) for `agentload run`."""
    cell = yaml.safe_load(live.cell_path.read_text()) | {"lambda_ref": 1.0, "all_miss_token_rate": 1000.0}
    files = {
        "cell.yaml": cell,
        "workload.yaml": {
            "kind": "workload",
            "name": "tiny",
            "first_prompt": 128,
            "tool_tokens": 32,
            "decode_tokens": D,
            "turns": {"mean": 3.0, "cap": 4},
            "tool_time": {"mean": 0.3},
        },
        "protocol.yaml": {
            "kind": "protocol",
            "name": "tiny",
            "duration": duration,
            "burst": {"time": 3.0, "size": 3, "width": 1.0},
            "window": {"start": 5.0, "end": duration},
            "min_window": 2.0,
            "backlog_bin": 1.0,
            "recovered_span": 2.0,
            "gauge_interval": 1.0,
        },
        "burst.yaml": {"kind": "arm", "name": "burst", "burst": True},
        "test.yaml": {
            "kind": "test",
            "name": "tiny-cli",
            "cell": "cell.yaml",
            "workload": "workload.yaml",
            "protocol": "protocol.yaml",
            "arms": ["burst.yaml"],
            "rates": [1.0],
            "seeds": [0],
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "test.yaml"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def case_cli_run_attached(live: Live, tmp_path: Path) -> None:
    """`agentload run --engine ... --base-url ...`: a BURST arm of a tiny test from config files to a
    COMPLETED run directory, through the runner, against the running server (the canary before
    it; the run command's smoke checks are the case above)."""
    from harness.recording.record import load_run

    test = _tiny_test_files(live, tmp_path, duration=horizon(live, 12.0))
    out = tmp_path / "out"
    cmd = _cli(
        "run",
        "--config",
        str(test),
        "--arm",
        "burst",
        "--rate",
        "1.0",
        "--seed",
        "0",
        "--engine",
        live.engine,
        "--base-url",
        live.url,
        "--served-model-name",
        live.model_name,
        "--out",
        str(out),
        "--no-smoke",
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = load_run(out)
    assert data.status == "COMPLETED" and not data.partial
    statuses = data.turns["status"].value_counts().to_dict()
    tag(live, f"agentload run: {statuses}")
    assert statuses.get("ok", 0) > 0 and set(statuses) <= {"ok", "unfinished"}, statuses
    assert len(data.gauges) >= 5
    assert data.meta["preflight"]["canary"]["after"] == 0 and "smoke" not in data.meta["preflight"]


def case_calibration_stage_c(live: Live, tmp_path: Path) -> None:
    """`agentload calibrate stage-c --engine ... --base-url ...`: a closed population of 4 over a
    short window on the running server, with the flush + canary before it; the window statistics
    are recomputed from the run's records and every follow-up hit as the cache predicts."""
    from analysis.calibration import window_stats
    from harness.recording.record import load_run
    from harness.workload.draws import expected_turns

    wl = {
        "kind": "workload",
        "name": "tiny-closed",
        "first_prompt": 128,
        "tool_tokens": 32,
        "decode_tokens": D,
        "turns": {"mean": 3.0, "cap": 4},
        "tool_time": {"mean": 0.3},
    }
    (tmp_path / "wl.yaml").write_text(yaml.safe_dump(wl))
    out = tmp_path / "cal"
    kind, _, flavor = live.engine.partition(":")
    engine = ["--engine", kind] + (["--flavor", flavor] if flavor else [])
    warmup, window = horizon(live, 3.0), horizon(live, 12.0)
    cmd = _cli(
        "calibrate",
        "stage-c",
        "--cell",
        str(live.cell_path),
        "--workload",
        str(tmp_path / "wl.yaml"),
        *engine,
        "--base-url",
        live.url,
        "--served-model-name",
        live.model_name,
        "--n",
        "4",
        "--warmup",
        f"{warmup:g}",
        "--window",
        f"{window:g}",
        "--no-smoke",
        "--out",
        str(out),
    )
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    tag(live, f"stage C ({time.monotonic() - t0:.1f} s):\n{proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "stage-c.json").read_text())
    (row,) = summary["result"]
    data = load_run(out / "stage-c-n4-s0")
    assert data.meta["status"] == "COMPLETED" and data.meta["population"] == 4
    assert data.meta["preflight"]["canary"]["after"] == 0
    workload = WorkloadConfig.model_validate(wl)
    again = window_stats(data.turns, data.sessions, warmup, warmup + window, expected_turns(workload), n=4, seed=0)
    assert row == json.loads(json.dumps(again.as_dict()))
    assert row["turns_completed"] > 0 and row["mu_turns"] > 0
    assert check_follow_ups(data.turns, live.block, workload) > 0
    assert row["token_hit_fraction"] > 0.3  # follow-ups reuse their whole previous turn


# ---------------------------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------------------------
def _wait_for_turns(
    path: Path, n: int, timeout: float, *, alive: Callable[[], bool] = lambda: True, follow_ups: bool = False
) -> int:
    """Wait until the run being written to `path` has n ok turns (follow-ups only, if asked)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            ok = sum(1 for r in rows if r.get("status") == "ok" and (not follow_ups or r.get("turn", 1) > 1))
            if ok >= n:
                return ok
        assert alive(), "the run ended before it recorded enough turns"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} ok turns in {path} after {timeout:.0f} s")


def _attached_run(
    live: Live, tmp_path: Path, workload: WorkloadConfig, plan: list[Any], **opts: Any
) -> tuple[Any, Any, Path]:
    from harness.client.openloop import PlanClient
    from harness.recording.record import RunRecorder, load_run
    from runs import realrun

    run_dir = tmp_path / "run"
    rec = RunRecorder(run_dir, {"test": "fault"})
    client = PlanClient(plan, workload, sink=rec)
    options = realrun.EngineOptions(
        engine=live.engine,
        base_url=live.url,
        served_model_name=live.model_name,
        cell_ref=str(live.cell_path),
        smoke=False,
        canary=False,
        **opts,
    )
    res = realrun.run_real(client, cell=live.cell, options=options, run_dir=run_dir, recorder=rec, gauge_interval=1.0)
    rec.close(res.status, res.reason)
    return res, load_run(run_dir), run_dir


FAULT_WORKLOAD = {
    "name": "tiny",
    "first_prompt": 128,
    "tool_tokens": 32,
    "decode_tokens": D,
    "turns": {"mean": 4.0, "cap": 6},
    "tool_time": {"mean": 0.3},
}


def case_hung_server_times_out(live: Live, tmp_path: Path) -> None:
    """The whole server stops answering (SIGSTOP to its process group) as the drive starts and
    for longer than the request timeout: every turn sent meanwhile is recorded as a timeout, the
    run completes flagged, and after SIGCONT the engine drops the abandoned requests and passes
    the canary again. (All sessions arrive after the stop, so the outcome does not depend on how
    fast the engine is on a loaded machine.)"""
    from harness.workload.draws import STREAM_BASE, draw_session

    workload = WorkloadConfig.model_validate(FAULT_WORKLOAD)
    plan = [draw_session(workload, 11, STREAM_BASE, i, 1.0 + 0.5 * i) for i in range(3)]
    timeout, stopped = 5.0, 9.0
    marks: dict[str, Any] = {}
    meta = tmp_path / "run" / "meta.json"

    def freeze() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the drive starts right after the preflight is recorded
            if meta.exists() and '"preflight"' in meta.read_text():
                break
            time.sleep(0.02)
        else:
            marks["error"] = "the run never reached its drive"
            return
        os.killpg(live.pgid, signal.SIGSTOP)
        marks["stop"] = time.monotonic()
        try:
            time.sleep(stopped)
        finally:
            os.killpg(live.pgid, signal.SIGCONT)
            marks["cont"] = time.monotonic()

    th = threading.Thread(target=freeze, daemon=True)
    th.start()
    try:
        res, data, _ = _attached_run(live, tmp_path, workload, plan, request_timeout=timeout)
    finally:
        th.join(timeout=stopped + 130)
        os.killpg(live.pgid, signal.SIGCONT)
    to = data.turns[data.turns["status"] == "timeout"]
    tag(live, f"hang: {res.status} {res.reason!r}; {len(to)} timeouts, {(data.turns['status'] == 'ok').sum()} ok turns")
    assert "stop" in marks, f"the server was never stopped: {marks.get('error')}"
    assert res.status == "COMPLETED" and res.flagged and res.timeouts == 3, res.reason
    assert (
        len(to) == 3
        and set(to["turn"]) == {1}
        and to["error"].str.contains(f"no complete response within {timeout:g} s").all()
    )
    assert ((to["done_time"] - to["send_time"]) >= 0.9 * timeout).all()
    assert len(data.turns) == 3  # a timeout ends its session (no retries): nothing else was sent

    async def after(http: aiohttp.ClientSession) -> Any:
        await live.adapter.flush_cache(http, live.url, timeout=120)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http)

    res2 = run(with_http(after))
    assert res2.passed and res2.after == 0, res2.reason


def case_sigterm_interrupts_an_attached_run(live: Live, tmp_path: Path) -> None:
    """`agentload run --engine ENGINE --base-url ...` passes the canary on the server and records
    follow-ups hitting whole pages; SIGTERM to the client then ends the run
    INTERRUPTED with its records kept, and leaves alone the server it did not launch: that one
    drops the abandoned requests and passes the canary again. (A server the run launched is
    stopped on the way out: tests/pipeline/test_faults.py with the emulator; the pool's stop checks the
    same for every real server.)"""
    from harness.recording.record import load_run

    test = _tiny_test_files(live, tmp_path / "cfg", duration=900.0)
    out = tmp_path / "out"
    cmd = _cli(
        "run",
        "--config",
        str(test),
        "--arm",
        "burst",
        "--rate",
        "1.0",
        "--seed",
        "0",
        "--engine",
        live.engine,
        "--base-url",
        live.url,
        "--served-model-name",
        live.model_name,
        "--out",
        str(out),
        "--request-timeout",
        "120",
        "--no-smoke",
    )
    t0 = time.monotonic()
    child = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _wait_for_turns(out / "turns.jsonl", 2, 600, alive=lambda: child.poll() is None, follow_ups=True)
        ready = time.monotonic() - t0
        os.kill(child.pid, signal.SIGTERM)
        t1 = time.monotonic()
        stdout, stderr = child.communicate(timeout=90)
        stop = time.monotonic() - t1
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
    meta = json.loads((out / "meta.json").read_text())
    tag(
        live,
        f"SIGTERM: {ready:.1f} s to 2 recorded follow-ups (canary included); exit {child.returncode} "
        f"{stop:.1f} s after the signal; {meta['status']}: {meta.get('status_reason')}",
    )
    assert child.returncode == 1 and "INTERRUPTED" in stdout, stdout[-2000:] + stderr[-2000:]
    assert meta["status"] == "INTERRUPTED" and "SIGTERM" in meta["status_reason"]
    assert "engine_launch" not in meta  # attached: nothing launched, nothing to stop
    pre = meta["preflight"]
    assert "smoke" not in pre and pre["canary"]["passed"] is True
    assert pre["canary"]["before"] == expected_cached(1024, live.block)  # 1023 or 992
    data = load_run(out)
    workload = WorkloadConfig.model_validate(
        {k: v for k, v in yaml.safe_load((tmp_path / "cfg" / "workload.yaml").read_text()).items() if k != "kind"}
    )
    assert check_follow_ups(data.turns, live.block, workload) >= 2
    assert live.alive()

    async def after(http: aiohttp.ClientSession) -> Any:
        await live.adapter.flush_cache(http, live.url, timeout=120)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http)

    res = run(with_http(after))
    assert res.passed and res.after == 0, res.reason


def case_dead_server_fails_the_run(live: Live, tmp_path: Path) -> None:
    """The server is killed (SIGKILL to its whole group) mid-run: the run ends FAILED with
    'server died', keeping every turn recorded before. (It kills the shared server: the pool
    starts a new one for any test that comes after.)"""
    workload = WorkloadConfig.model_validate(FAULT_WORKLOAD)
    plan = sessions(workload, 30, rate=1.0, seed=13)
    marks: dict[str, Any] = {}

    def kill() -> None:
        marks["ok_before"] = _wait_for_turns(tmp_path / "run" / "turns.jsonl", 2, 300)
        os.killpg(live.pgid, signal.SIGKILL)
        marks["killed"] = time.monotonic()

    th = threading.Thread(target=kill, daemon=True)
    th.start()
    t0 = time.monotonic()
    res, data, _ = _attached_run(live, tmp_path, workload, plan, request_timeout=120.0)
    th.join(timeout=310)
    tag(
        live,
        f"dead server: {res.status} {res.reason!r} {time.monotonic() - marks.get('killed', t0):.1f} s after the kill",
    )
    assert "killed" in marks
    assert res.status == "FAILED" and "server died" in res.reason, res.reason
    assert data.meta["status"] == "FAILED" and "server died" in data.meta["status_reason"]
    assert (data.turns["status"] == "ok").sum() >= marks["ok_before"]  # everything before the crash is kept
    assert not live.alive()
