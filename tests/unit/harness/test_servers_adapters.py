"""Engine adapters without an engine: flags per cell, request/response shapes, flush semantics and
Prometheus mapping (start and stop of the process group: test_servers_start_stop.py)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest
import yaml
from aiohttp import web
from support.adapter_cells import flag as _flag
from support.adapter_cells import small_cell as _cell

from harness.config import CellConfig, load_config
from harness.servers import (
    FlushError,
    ResponseError,
    free_port,
    get_adapter,
)
from harness.servers.emulator import EmulatorAdapter
from harness.servers.metrics import COMMON_METRICS, SGLANG_RULES, VLLM_RULES, map_metrics, parse_prometheus
from harness.servers.sglang import SGLangAdapter
from harness.servers.smoke import CanaryResult, Check, SmokeReport, canary_prompt, expected_cached
from harness.servers.vllm import ENGINE_CACHE_ENV, VLLMAdapter, private_cache_env


@pytest.fixture(autouse=True)
def _no_engine_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch environments are asserted whole, so the caller's engine cache (CI exports one for the
    real-engine tests) must not leak in; test_vllm_launch_command_engine_cache sets it on purpose."""
    monkeypatch.delenv(ENGINE_CACHE_ENV, raising=False)


# ---------------------------------------------------------------------------------------------
# launch commands
# ---------------------------------------------------------------------------------------------
def test_vllm_launch_command_paper_cell() -> None:
    cell = load_config("cells/vllm-a100-300k", CellConfig)
    a = VLLMAdapter(server_cmd=["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"])
    argv, env = a.launch_command(
        cell, model=cell.model, host="127.0.0.1", port=8123, extra_args=["--dtype", "bfloat16"]
    )
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--num-gpu-blocks-override") == "18750"  # 300,000 / 16
    assert _flag(argv, "--block-size") == "16"
    assert _flag(argv, "--max-num-seqs") == "256"
    assert _flag(argv, "--max-num-batched-tokens") == "8192"
    assert _flag(argv, "--max-model-len") == "49152"
    assert _flag(argv, "--scheduling-policy") == "fcfs"
    assert _flag(argv, "--served-model-name") == cell.model
    assert _flag(argv, "--revision") == cell.model_revision
    assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
    assert argv[-2:] == ["--dtype", "bfloat16"]
    assert env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert a.block_size == 16


def test_vllm_launch_command_engine_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENGINE_CACHE_ENV, str(tmp_path / "cache"))
    _, env = VLLMAdapter().launch_command(_cell(), model="m", host="127.0.0.1", port=1)
    assert env == {"VLLM_SERVER_DEV_MODE": "1", **private_cache_env(tmp_path / "cache")}
    assert Path(env["VLLM_CACHE_ROOT"]).is_relative_to(tmp_path / "cache")


def test_vllm_launch_command_variants() -> None:
    a = VLLMAdapter()
    argv, _ = a.launch_command(_cell(prefix_cache=False), model="/models/tiny", host="127.0.0.1", port=1)
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert "--revision" not in argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # never `vllm serve`
    with pytest.raises(ValueError, match="whole number"):
        a.launch_command(_cell(kv_pool_tokens=1000), model="m", host="h", port=1)


def test_vllm_python_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOAD_VLLM_PYTHON", "/x/bin/python")
    argv, _ = VLLMAdapter().launch_command(_cell(), model="m", host="127.0.0.1", port=1)
    assert argv[0] == "/x/bin/python"


def test_sglang_launch_command_paper_cell() -> None:
    cell = load_config("cells/sglang-a100-300k", CellConfig)
    argv, env = SGLangAdapter(server_cmd=["sgl"]).launch_command(
        cell, model="/weights/qwen", host="127.0.0.1", port=30000
    )
    assert argv[0] == "sgl"
    assert _flag(argv, "--model-path") == "/weights/qwen"
    assert _flag(argv, "--max-total-tokens") == "300000"
    assert _flag(argv, "--schedule-policy") == "fcfs"
    assert _flag(argv, "--chunked-prefill-size") == "8192"
    assert _flag(argv, "--max-running-requests") == "256"
    assert _flag(argv, "--page-size") == "1"
    assert _flag(argv, "--context-length") == "49152"
    assert _flag(argv, "--radix-eviction-policy") == "lru"
    assert _flag(argv, "--attention-backend") == "flashinfer"
    assert "--enable-cache-report" in argv and "--enable-metrics" in argv
    assert "--disable-radix-cache" not in argv and "--revision" not in argv  # local path: no revision
    assert env == {}


def test_sglang_lpm_and_cache_off() -> None:
    cell = _cell(engine={"name": "sglang", "version": "0.5.22"}, page_size=1, schedule_policy="lpm", prefix_cache=False)
    argv, _ = SGLangAdapter().launch_command(cell, model="m", host="127.0.0.1", port=1)
    assert _flag(argv, "--schedule-policy") == "lpm" and "--disable-radix-cache" in argv


def test_emulator_launch_command() -> None:
    cell = _cell()
    a = get_adapter("emulator", cell=cell, cell_ref="/cfg/cell.yaml", time_scale=4.0)
    assert isinstance(a, EmulatorAdapter) and a.flavor == "vllm" and a.block_size == 32
    argv, env = a.launch_command(cell, model="ignored", host="127.0.0.1", port=9)
    assert argv[:4] == [sys.executable, "-m", "harness.emulator", "serve"]
    assert _flag(argv, "--flavor") == "vllm" and env == {}
    assert _flag(argv, "--time-scale") == "4" and _flag(argv, "--port") == "9"
    # the ref does not exist: the cell object itself is written out for the emulator
    assert load_config(_flag(argv, "--cell"), CellConfig) == cell
    assert get_adapter("emulator:sglang").flavor == "sglang"  # type: ignore[attr-defined]


def test_emulator_cell_file(tmp_path: Path) -> None:
    from harness.servers.emulator import cell_file

    ref = tmp_path / "c.yaml"
    ref.write_text(yaml.safe_dump(_cell().model_dump(mode="json")))
    assert cell_file(_cell(), str(ref)) == str(ref.resolve())  # a ref that holds this cell is kept
    other = cell_file(_cell(max_running=8), str(ref))  # a ref holding another cell is not
    assert other != str(ref.resolve()) and load_config(other, CellConfig) == _cell(max_running=8)
    assert cell_file(_cell(max_running=8)) == other  # content-addressed: one file per cell
    paper = load_config("cells/sglang-a100-300k", CellConfig)
    assert load_config(cell_file(paper), CellConfig) == paper  # cost_file cells round-trip


def test_get_adapter() -> None:
    assert isinstance(get_adapter("sglang"), SGLangAdapter) and get_adapter("sglang").block_size == 1
    assert get_adapter("vllm").block_size == 16
    assert get_adapter("vllm", cell=_cell()).block_size == 32
    with pytest.raises(ValueError, match="unknown engine"):
        get_adapter("tgi")
    with pytest.raises(ValueError, match="flavor"):
        get_adapter("emulator", flavor="tgi")


def test_private_cache_env(tmp_path: Path) -> None:
    env = private_cache_env(tmp_path / "c")
    for key in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"):
        assert Path(env[key]).is_dir() and Path(env[key]).is_relative_to(tmp_path)
    assert env["HF_HUB_OFFLINE"] == "1"


# ---------------------------------------------------------------------------------------------
# requests and responses
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", [SGLangAdapter(), EmulatorAdapter("sglang")])
def test_sglang_request_is_native_generate(adapter) -> None:  # type: ignore[no-untyped-def]
    # /generate: the same engine path as /v1/completions, and the only one answering with timings
    path, body = adapter.completion_request(np.array([5, 6, 7], dtype=np.int32), 100, "m")
    assert path == "/generate"
    assert orjson.loads(body) == {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 100, "temperature": 0.0, "ignore_eos": True},
    }


@pytest.mark.parametrize("adapter", [VLLMAdapter(), EmulatorAdapter("vllm")])
def test_completion_request_body(adapter) -> None:  # type: ignore[no-untyped-def]
    path, body = adapter.completion_request(np.array([5, 6, 7], dtype=np.int32), 100, "m")
    assert path == "/v1/completions"
    assert orjson.loads(body) == {
        "model": "m",
        "prompt": [5, 6, 7],
        "max_tokens": 100,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": False,
    }


VLLM_BODY = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "text": " w1 w2",
            "finish_reason": "length",
            "token_ids": [11, 12, 13],
            "prompt_token_ids": [1] * 1080,
        }
    ],
    "usage": {
        "prompt_tokens": 1080,
        "total_tokens": 1083,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 992, "created_cache_tokens": None},
    },
}


def test_parse_vllm_response() -> None:
    t = VLLMAdapter().parse_completion(200, orjson.dumps(VLLM_BODY))
    assert t.output_ids.tolist() == [11, 12, 13] and t.output_ids.dtype == np.int32
    assert (t.prompt_tokens, t.cached_tokens, t.completion_tokens) == (1080, 992, 3)
    assert t.extra == {"finish_reason": "length", "server_prompt_len": 1080}


# meta_info of a real SGLang 0.5.22 /generate answer (CPU, --enable-metrics), trimmed of ids
SGLANG_META = {
    "finish_reason": {"type": "length", "length": 16},
    "prompt_tokens": 300,
    "num_retractions": 0,
    "forward_entry_time": 1796185360.012167,
    "prefill_finished_time": 1796185360.1525536,
    "queue_time": 0.0006259900001168717,
    "completion_tokens": 16,
    "cached_tokens": 299,
    "cached_tokens_details": {"device": 299, "host": 0},
    "e2e_latency": 1.1174015790020349,
    "request_received_ts": 1796185359.990771,
    "first_token_latency": 0.1617825361463474,
    "request_finished_ts": 1796185361.1081727,
    "decode_throughput": 15.696631531300723,
}


def test_parse_sglang_generate_counts_and_engine_timings() -> None:
    body = {"text": "w1", "output_ids": list(range(16)), "meta_info": SGLANG_META}
    t = SGLangAdapter().parse_completion(200, orjson.dumps(body))
    assert (t.prompt_tokens, t.cached_tokens, t.completion_tokens) == (300, 299, 16)
    assert t.output_ids.tolist() == list(range(16)) and t.output_ids.dtype == np.int32
    assert t.extra["finish_reason"] == "length"
    assert t.extra["queue_time"] == pytest.approx(0.000626, rel=1e-3)
    assert t.extra["engine_ttft"] == pytest.approx(0.1525536 - 0.012167, abs=1e-6)  # scheduled -> first token
    assert t.extra["engine_decode"] == pytest.approx(1.1081727 - 0.1525536, abs=1e-6)  # first -> last token
    # without --enable-metrics there are no stamps: counts only, no timings; no cached count = 0
    bare = {k: v for k, v in SGLANG_META.items() if not k.endswith(("_time", "_ts")) and k != "cached_tokens"}
    t = SGLangAdapter().parse_completion(200, orjson.dumps({"output_ids": [4, 5], "meta_info": bare}))
    assert t.cached_tokens == 0 and not {"queue_time", "engine_ttft", "engine_decode"} & set(t.extra)


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (200, b"{not json", "malformed JSON"),
        (200, orjson.dumps({"meta_info": {"prompt_tokens": 1}}), "output_ids"),
        (200, orjson.dumps({"output_ids": [1]}), "missing meta_info"),
        (200, orjson.dumps({"output_ids": [1], "meta_info": {}}), "missing meta_info.prompt_tokens"),
        (400, orjson.dumps({"error": {"message": "The input (69900 tokens) is longer"}}), "is longer"),
    ],
)
def test_parse_sglang_errors(status: int, body: bytes, reason: str) -> None:
    with pytest.raises(ResponseError) as info:
        SGLangAdapter().parse_completion(status, body)
    assert reason in info.value.reason and info.value.http_status == status


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (200, b"{not json", "malformed JSON"),
        (200, orjson.dumps({"choices": []}), "missing choices[0]"),
        (200, orjson.dumps({"choices": [{"text": ""}], "usage": {"prompt_tokens": 1}}), "token_ids"),
        (200, orjson.dumps({"choices": [{"token_ids": [1]}], "usage": {}}), "missing usage.prompt_tokens"),
        (200, orjson.dumps({"choices": [{"token_ids": [1]}]}), "missing usage"),
        (
            200,
            orjson.dumps({"choices": [{"token_ids": ["a"]}], "usage": {"prompt_tokens": 1}}),
            "not a list of integers",
        ),
        (
            400,
            orjson.dumps({"error": {"message": "maximum context length is 8192", "type": "BadRequestError"}}),
            "maximum context length",
        ),
        (400, orjson.dumps({"object": "error", "message": "input too long", "code": 400}), "input too long"),
        (503, b"", "empty body"),
    ],
)
def test_parse_errors(status: int, body: bytes, reason: str) -> None:
    with pytest.raises(ResponseError) as info:
        VLLMAdapter().parse_completion(status, body)
    assert reason in info.value.reason and info.value.http_status == status and info.value.status == "error"


# ---------------------------------------------------------------------------------------------
# flush semantics against a fake server
# ---------------------------------------------------------------------------------------------
async def _serve(routes: list[web.RouteDef]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def test_vllm_flush_checks_success_body() -> None:
    answers = [b'{"success":false}', b'{"success":false}', b'{"success":true}']
    calls: list[str] = []

    async def reset(request: web.Request) -> web.Response:
        calls.append(request.method)
        return web.Response(body=answers[min(len(calls) - 1, 2)], content_type="application/json")

    async def go() -> None:
        runner, url = await _serve([web.post("/reset_prefix_cache", reset)])
        try:
            async with aiohttp.ClientSession() as http:
                await VLLMAdapter().flush_cache(http, url, timeout=10)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert calls == ["POST"] * 3


def test_vllm_flush_refused_and_missing() -> None:
    async def refuse(_r: web.Request) -> web.Response:
        return web.json_response({"success": False})

    async def go(route: web.RouteDef, match: str) -> None:
        runner, url = await _serve([route])
        try:
            async with aiohttp.ClientSession() as http:
                with pytest.raises(FlushError, match=match):
                    await VLLMAdapter().flush_cache(http, url, timeout=1.0)
        finally:
            await runner.cleanup()

    asyncio.run(go(web.post("/reset_prefix_cache", refuse), "refused"))
    asyncio.run(go(web.post("/other", refuse), "VLLM_SERVER_DEV_MODE"))


def test_sglang_flush_retries_on_400() -> None:
    seen: list[str] = []

    async def flush(request: web.Request) -> web.Response:
        seen.append(request.query.get("timeout", ""))
        return web.Response(status=400 if len(seen) < 3 else 200, text="Cache flushed.\n")

    async def go() -> None:
        runner, url = await _serve([web.post("/flush_cache", flush)])
        try:
            async with aiohttp.ClientSession() as http:
                await SGLangAdapter().flush_cache(http, url, timeout=10)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert len(seen) == 3 and all(float(x) > 0 for x in seen)


# ---------------------------------------------------------------------------------------------
# Prometheus mapping
# ---------------------------------------------------------------------------------------------
VLLM_METRICS = textwrap.dedent(
    """\
    # HELP vllm:num_requests_running Number of requests in model execution batches.
    # TYPE vllm:num_requests_running gauge
    vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
    # TYPE vllm:num_requests_waiting gauge
    vllm:num_requests_waiting{engine="0",model_name="tiny"} 7.0
    # TYPE vllm:kv_cache_usage_perc gauge
    vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
    # TYPE vllm:prompt_tokens counter
    vllm:prompt_tokens_total{engine="0",model_name="tiny"} 3160.0
    vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.79e+09
    # TYPE vllm:prompt_tokens_cached counter
    vllm:prompt_tokens_cached_total{engine="0",model_name="tiny"} 992.0
    # TYPE vllm:generation_tokens counter
    vllm:generation_tokens_total{engine="0",model_name="tiny"} 48.0
    # TYPE vllm:num_preemptions counter
    vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
    # TYPE vllm:cache_config_info gauge
    """
    'vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",kv_cache_dtype_skip_layers="[]",'
    'num_gpu_blocks="1024",prefix_caching_hash_algo="sha256, v2"} 1.0\n'
)

SGLANG_METRICS = textwrap.dedent(
    """\
    # TYPE sglang:num_running_reqs gauge
    sglang:num_running_reqs{model_name="q",tp_rank="0"} 5.0
    sglang:num_running_reqs{model_name="q",tp_rank="1"} 5.0
    # TYPE sglang:num_queue_reqs gauge
    sglang:num_queue_reqs{model_name="q",tp_rank="0"} 40.0
    # TYPE sglang:token_usage gauge
    sglang:token_usage{model_name="q",tp_rank="0"} 0.5
    # TYPE sglang:max_total_num_tokens gauge
    sglang:max_total_num_tokens{model_name="q",tp_rank="0"} 300000.0
    sglang:max_total_num_tokens{model_name="q",tp_rank="1"} 300000.0
    # TYPE sglang:kv_evictable_tokens gauge
    sglang:kv_evictable_tokens{model_name="q",tp_rank="0"} 1000.0
    # TYPE sglang:cached_tokens counter
    sglang:cached_tokens_total{model_name="q",tp_rank="0"} 123.0
    # TYPE sglang:num_retracted_requests counter
    sglang:num_retracted_requests_total{model_name="q",tp_rank="0"} 4.0
    """
)


def test_vllm_metrics_mapping() -> None:
    m = map_metrics(parse_prometheus(VLLM_METRICS), VLLM_RULES)
    assert m == {
        "running": 3.0,
        "waiting": 7.0,
        "pool_tokens": 32768.0,
        "kv_usage_frac": 0.25,
        "kv_used_tokens": 8192.0,
        "prompt_tokens_total": 3160.0,
        "cached_tokens_total": 992.0,
        "generation_tokens_total": 48.0,
        "preemptions_total": 2.0,
    }
    assert set(m) <= set(COMMON_METRICS) and "kv_evictable_tokens" not in m


def test_sglang_metrics_mapping() -> None:
    m = map_metrics(parse_prometheus(SGLANG_METRICS), SGLANG_RULES)
    assert m["running"] == 5.0  # tensor-parallel ranks replicate the scheduler's state
    assert m["pool_tokens"] == 300000.0 and m["waiting"] == 40.0
    assert m["kv_used_tokens"] == 150000.0  # token_usage x pool when kv_used_tokens is not exported
    assert m["kv_evictable_tokens"] == 1000.0 and m["preemptions_total"] == 4.0
    assert "prompt_tokens_total" not in m  # absent series stay absent


def test_metric_names_fit_the_gauge_table() -> None:
    from harness.recording.record import SCHEMAS

    table = set(SCHEMAS["gauges"].names)
    assert set(COMMON_METRICS) - table <= {"kv_usage_frac"}


# ---------------------------------------------------------------------------------------------
# smoke bookkeeping
# ---------------------------------------------------------------------------------------------
def test_expected_cached_and_canary_thresholds() -> None:
    assert expected_cached(1024, 1) == 1023
    assert expected_cached(1024, 16) == 1008
    assert expected_cached(1024, 32) == 992
    assert expected_cached(2100, 32) == 2080  # 2000 prompt + 100 output: the last output is not cached
    for bs, before in ((1, 1023), (16, 1008), (32, 992)):
        r = CanaryResult(before=before, after=0, block_size=bs, min_before=1024 - bs - 1)
        assert r.passed, bs
    assert not CanaryResult(before=992, after=16, block_size=32, min_before=991).passed
    assert not CanaryResult(before=960, after=0, block_size=32, min_before=991).passed
    bad = CanaryResult(before=-1, after=-1, block_size=1, min_before=1022, error="FlushError: refused")
    assert not bad.passed and bad.reason == "FlushError: refused"
    assert len(canary_prompt()) == 1024 and canary_prompt().tolist() == canary_prompt().tolist()


def test_smoke_report_reason() -> None:
    r = SmokeReport(
        engine="vllm",
        base_url="u",
        cell="c",
        checks=[Check("a", True), Check("pool_size", False, {"configured": 1, "reported": 2})],
    )
    assert not r.passed and "pool_size failed" in r.reason and "reported=2" in r.reason
    assert r.to_dict()["checks"][1]["name"] == "pool_size"
    assert not SmokeReport(engine="e", base_url="u", cell="c").passed  # no checks run = not passed


# ---------------------------------------------------------------------------------------------
# emulator adapter: the engine clock runs at exactly the driver's time scale
# ---------------------------------------------------------------------------------------------
def _small_cell(flavor: str = "sglang") -> CellConfig:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    return base.model_copy(update={"kv_pool_tokens": 60_000, "context_length": 8192})


def test_emulator_time_scale_is_passed_exactly() -> None:
    cell = _small_cell("sglang")
    for scale in (4.0, 100.0, 123.456789, 1 / 3):
        argv, _ = get_adapter("emulator", cell=cell, time_scale=scale).launch_command(
            cell, model="m", host="127.0.0.1", port=9
        )
        assert float(argv[argv.index("--time-scale") + 1]) == scale
