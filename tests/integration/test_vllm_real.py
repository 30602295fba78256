"""A real vLLM 0.32 server on the CPU (and our emulator in both dialects) through the engine adapters:
Stage 0 smoke, the canary, /metrics scraping, and a short open-loop run through the asyncio driver.

Why a real engine in the test suite: the facts the experiment rests on (cached tokens reported
per request, hits at block granularity, a flush that really empties the cache, the pool the cell
asks for) are properties of the engine, not of our code; the emulator reproduces them, and
running the same tests against both is what keeps the emulator honest.

The vLLM tests need AGENTLOAD_VLLM_PYTHON (the engine venv's python; scripts/ci-engine-tests.sh
sets it up) and use AGENTLOAD_TINY_MODEL when set (else the model is built here). One server per
module (its start is 25-90 s on a 2-core machine); `-m vllm` selects only the real-engine tests.

Scaled down for a CPU (a 40k-token prefill takes ~8 s there): a 32,768-token pool of 32-token
blocks (CPU attention needs multiples of 32), an 8,192-token context, so the smoke test's long
context check sends 8,191 tokens instead of the workload's 40,350 (it reports `capped`); the run
is 20 sessions of L0 256, Delta 64, d 16, up to 5 turns, tools of 0.5 s on average.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import numpy as np
import pytest
import yaml

from harness.config import CellConfig, WorkloadConfig, load_config
from harness.servers import EngineAdapter, ServerHandle, free_port, get_adapter
from harness.servers.metrics import COMMON_METRICS
from harness.servers.smoke import canary, expected_cached, run_smoke
from harness.servers.vllm import private_cache_env

REPO = Path(__file__).resolve().parents[2]
POOL = 32_768
CONTEXT = 8_192
D = 16

ENGINES = [pytest.param("vllm", marks=pytest.mark.vllm, id="vllm"), pytest.param("emulator:sglang", id="emulator-sglang"), pytest.param("emulator:vllm", id="emulator-vllm")]


@dataclass
class Live:
    engine: str
    adapter: EngineAdapter
    cell: CellConfig
    cell_path: Path
    handle: ServerHandle
    model_name: str
    start_seconds: float

    @property
    def url(self) -> str:
        return self.handle.base_url

    @property
    def block(self) -> int:
        return self.cell.page_size


def _cell_yaml(engine: str, path: Path) -> Path:
    sglang = engine == "emulator:sglang"
    data = {
        "kind": "cell",
        "name": f"tiny-{'sglang' if sglang else 'vllm'}-cpu",
        "description": "test cell: tiny random model on a CPU, scaled-down pool and context",
        "engine": {"name": "sglang", "version": "0.5.22"} if sglang else {"name": "vllm", "version": "0.32.0"},
        "model": "tiny",
        "gpu": "cpu",
        "kv_pool_tokens": POOL,
        "page_size": 1 if sglang else 32,
        "schedule_policy": "fcfs",
        "chunked_prefill": CONTEXT,
        "max_running": 16,
        "prefix_cache": True,
        "waiting_prefix_refresh": sglang,
        "batching": "separate" if sglang else "mixed",
        "context_length": CONTEXT,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _tiny_model(python: str, tmp: Path) -> str:
    env_model = os.environ.get("AGENTLOAD_TINY_MODEL")
    if env_model and (Path(env_model) / "config.json").exists():
        return env_model
    out = tmp / "tiny-model"
    subprocess.run([python, str(REPO / "harness/servers/tiny_model.py"), str(out)], check=True, capture_output=True, timeout=300)
    return str(out)


@pytest.fixture(scope="module", params=ENGINES)
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    engine: str = request.param
    tmp = tmp_path_factory.mktemp(engine.replace(":", "-"))
    cell_path = _cell_yaml(engine, tmp / "cell.yaml")
    cell = load_config(cell_path, CellConfig)
    extra: list[str] = []
    env_more: dict[str, str] = {}
    if engine == "vllm":
        python = os.environ.get("AGENTLOAD_VLLM_PYTHON")
        if not python:
            pytest.skip("AGENTLOAD_VLLM_PYTHON is unset: the real-vLLM tests need the engine venv (scripts/ci-engine-tests.sh sets it up)")
        model = _tiny_model(python, tmp)
        adapter = get_adapter("vllm", cell=cell, server_cmd=[python, "-m", "vllm.entrypoints.openai.api_server"])
        # 256 MiB of KV memory holds the 1,024 blocks; eager mode starts ~2x faster than compiling
        # on a fresh machine and the test's requests are tiny.
        extra = ["--dtype", "bfloat16", "--kv-cache-memory-bytes", str(256 << 20), "--max-num-seqs", "16"]
        if os.environ.get("AGENTLOAD_VLLM_COMPILE") != "1":
            extra.append("--enforce-eager")
        cache = Path(os.environ.get("AGENTLOAD_ENGINE_CACHE") or tmp / "engine-cache")
        env_more = private_cache_env(cache)
        timeout = 600.0
    else:
        model = cell.model
        adapter = get_adapter(engine, cell=cell, cell_ref=str(cell_path))
        timeout = 60.0
    port = free_port()
    argv, env = adapter.launch_command(cell, model=model, host="127.0.0.1", port=port, extra_args=extra)
    env.update(env_more)
    t0 = time.monotonic()
    handle = adapter.start(argv, env, tmp / "run", host="127.0.0.1", port=port, health_timeout=timeout)
    started = time.monotonic() - t0
    print(f"\n[{engine}] healthy after {started:.1f} s at {handle.base_url}")
    try:
        yield Live(engine, adapter, cell, cell_path, handle, adapter.served_model_name(cell), started)
    finally:
        adapter.stop(handle)


async def _with_http(fn: Any) -> Any:
    async with aiohttp.ClientSession() as http:
        return await fn(http)


def test_smoke(live: Live) -> None:
    report = asyncio.run(run_smoke(live.adapter, live.url, live.cell, model_name=live.model_name, launched_argv=[]))
    print(f"[{live.engine}] " + report.summary().replace("\n", f"\n[{live.engine}] "))
    assert report.passed, report.reason
    bs = live.block
    assert report.check("cached_tokens_reported").detail["repeat"] == expected_cached(64, bs)
    assert report.check("output_ids_returned").detail["returned_ids"] == 100
    long = report.check("long_context_accepted").detail
    assert long["sent"] == CONTEXT - 1 and long["capped"]  # documented: the tiny server's max context
    assert report.check("pool_size").detail["reported"] == POOL
    assert report.check("prompt_length_agreement").detail["mismatches"] == 0
    assert report.canary is not None and report.canary.after == 0
    json.dumps(report.to_dict(), default=str)  # the report is what a run's meta.json records


def test_canary(live: Live) -> None:
    res = asyncio.run(canary(live.adapter, live.url, model_name=live.model_name))
    print(f"[{live.engine}] canary: {res.to_dict()}")
    assert res.passed, res.reason
    assert res.before == expected_cached(1024, live.block)  # 1023 (SGLang), 992 (32-token blocks)
    assert res.after == 0


def test_gauges_scraped_and_mapped(live: Live) -> None:
    m = asyncio.run(_with_http(lambda http: live.adapter.scrape_metrics(http, live.url)))
    print(f"[{live.engine}] gauges: {m}")
    assert set(m) <= set(COMMON_METRICS)
    for name in ("running", "waiting", "pool_tokens", "kv_usage_frac", "prompt_tokens_total", "cached_tokens_total", "generation_tokens_total"):
        assert name in m, name
    assert m["pool_tokens"] == POOL
    assert m["running"] == 0 and m["waiting"] == 0
    assert m["prompt_tokens_total"] > 0  # the smoke test and canary ran before
    if live.cell.engine.name == "sglang":
        assert "kv_evictable_tokens" in m


def _sessions(workload: WorkloadConfig, n: int, rate: float, seed: int) -> list[Any]:
    from harness.workload.draws import STREAM_BASE, draw_session

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [draw_session(workload, seed, STREAM_BASE, i, float(t)) for i, t in enumerate(arrivals)]


def test_open_loop_run(live: Live, tmp_path: Path) -> None:
    """20 sessions through the asyncio driver and the open-loop client: every follow-up reuses
    exactly the previous prompt and output, whole blocks only; gauges are recorded; the flush
    then empties the cache."""
    from harness.drivers.wall import COMPLETED, drive
    from harness.client.openloop import PlanClient
    from harness.recording.record import RunRecorder, load_run

    workload = WorkloadConfig.model_validate({
        "name": "tiny", "first_prompt": 256, "tool_tokens": 64, "decode_tokens": D,
        "turns": {"mean": 3.0, "cap": 5}, "tool_time": {"mean": 0.5},
    })  # fmt: skip
    sessions = _sessions(workload, 20, rate=2.0, seed=7)
    rec = RunRecorder(tmp_path / "run", {"test": "open-loop", "engine": live.engine})
    client = PlanClient(sessions, workload, sink=rec)
    t0 = time.monotonic()
    result = asyncio.run(
        drive(client, live.adapter, live.url, model_name=live.model_name, recorder=rec, gauge_interval=1.0, request_timeout=120.0, handle_signals=False)
    )
    wall = time.monotonic() - t0
    rec.close()
    run = load_run(tmp_path / "run")
    assert result.status == COMPLETED, result.reason
    assert result.errors == 0 and result.timeouts == 0 and client.prompt_mismatches == 0

    turns = run.turns.sort_values(["session", "turn"])
    assert (turns["status"] == "ok").all()
    assert (run.sessions["outcome"] == "completed").all() and len(run.sessions) == 20
    assert len(turns) == sum(s.n_turns for s in sessions)
    assert (turns["n_output_ids"] == D).all()
    bs = live.block
    follow = 0
    for _sid, g in turns.groupby("session"):
        g = g.reset_index(drop=True)
        # A fresh session shares nothing but, with 1-token pages, a chance equal first token or two
        # with another random prompt (a real SGLang matches those too).
        assert g.loc[0, "cached_tokens"] < max(bs, 3)
        for k in range(1, len(g)):
            prev = int(g.loc[k - 1, "prompt_tokens"])
            assert g.loc[k, "prompt_tokens"] == prev + D + workload.tool_tokens
            assert g.loc[k, "cached_tokens"] == expected_cached(prev + D, bs), (k, prev)
            follow += 1
    assert follow > 0

    gauges = run.gauges
    print(f"[{live.engine}] open loop: {len(turns)} turns ({follow} follow-ups) in {wall:.1f} s; "
          f"{len(gauges)} gauge rows; last {gauges.iloc[-1].to_dict() if len(gauges) else None}")  # fmt: skip
    assert result.gauge_scrapes >= 2 and len(gauges) == result.gauge_scrapes
    assert (gauges["pool_tokens"] == POOL).all()
    assert gauges["running"].notna().all() and gauges["prompt_tokens_total"].is_monotonic_increasing
    assert gauges["cached_tokens_total"].iloc[-1] > 0

    async def after(http: aiohttp.ClientSession) -> tuple[Any, dict[str, float]]:
        await live.adapter.flush_cache(http, live.url, timeout=30)
        m = await live.adapter.scrape_metrics(http, live.url)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http), m

    res, m = asyncio.run(_with_http(after))
    assert res.passed and res.after == 0, res.reason
    if "kv_evictable_tokens" in m:
        assert m["kv_evictable_tokens"] == 0  # the run's idle KV is gone, not just the canary's


def test_run_real_attached(live: Live, tmp_path: Path) -> None:
    """The run command's real-engine path against the running server: smoke, canary, drive, meta."""
    realrun = pytest.importorskip("harness.protocols.realrun")
    from harness.client.openloop import PlanClient
    from harness.recording.record import RunRecorder, load_run

    workload = WorkloadConfig.model_validate({"name": "tiny", "first_prompt": 128, "tool_tokens": 32, "decode_tokens": D,
                                              "turns": {"mean": 2.0, "cap": 3}, "tool_time": {"mean": 0.2}})  # fmt: skip
    sessions = _sessions(workload, 4, rate=4.0, seed=3)
    rec = RunRecorder(tmp_path / "run", {"test": "run_real"})
    client = PlanClient(sessions, workload, sink=rec)
    opts = realrun.EngineOptions(engine=live.engine, base_url=live.url, served_model_name=live.model_name, cell_ref=str(live.cell_path))
    result = realrun.run_real(client, cell=live.cell, options=opts, run_dir=tmp_path / "run", recorder=rec, gauge_interval=1.0)
    rec.close()
    assert result.status == "COMPLETED", result.reason
    meta = load_run(tmp_path / "run").meta
    pre = meta.get("preflight", {})
    assert pre.get("smoke", {}).get("passed") is True, pre
    assert pre.get("canary", {}).get("after") == 0, pre


def test_cli_run_attached(live: Live, tmp_path: Path) -> None:
    """`agentload run --engine ... --base-url ...`: a BURST arm of a tiny test from config files to a
    COMPLETED run directory, through the runner, against the running server."""
    cell = yaml.safe_load(live.cell_path.read_text()) | {"lambda_ref": 1.0, "all_miss_token_rate": 1000.0}
    files = {
        "cell.yaml": cell,
        "workload.yaml": {"kind": "workload", "name": "tiny", "first_prompt": 128, "tool_tokens": 32, "decode_tokens": D,
                          "turns": {"mean": 3.0, "cap": 4}, "tool_time": {"mean": 0.3}},
        "protocol.yaml": {"kind": "protocol", "name": "tiny", "duration": 10.0, "burst": {"time": 3.0, "size": 3, "width": 1.0},
                          "window": {"start": 5.0, "end": 10.0}, "min_window": 2.0, "backlog_bin": 1.0,
                          "recovered_span": 2.0, "gauge_interval": 1.0},
        "burst.yaml": {"kind": "arm", "name": "burst", "burst": True},
        "test.yaml": {"kind": "test", "name": "tiny-cli", "cell": "cell.yaml", "workload": "workload.yaml",
                      "protocol": "protocol.yaml", "arms": ["burst.yaml"], "rates": [1.0], "seeds": [0]},
    }  # fmt: skip
    for name, data in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "harness.cli", "run", "--config", str(tmp_path / "test.yaml"), "--arm", "burst", "--rate", "1.0",
           "--seed", "0", "--engine", live.engine, "--base-url", live.url, "--served-model-name", live.model_name, "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    from harness.recording.record import load_run

    run = load_run(out)
    assert run.status == "COMPLETED" and not run.partial
    ok = run.turns[run.turns["status"] == "ok"]
    assert len(ok) > 0 and (run.turns["status"].isin(["ok", "unfinished"])).all()
    assert len(run.gauges) >= 5
    assert run.meta["preflight"]["canary"]["after"] == 0
