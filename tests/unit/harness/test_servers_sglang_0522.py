"""The SGLang 0.5.22 adapter as measured on a real server (docs/sglang-cpu.md), without an engine:
the CPU launch from the cell, the checks of mem_fraction_static, each engine's longest prompt, and
the /metrics scrape before a hit. Split from test_servers_adapters.py (flags, request/response
shapes, flush semantics, Prometheus mapping), whose cell helpers these tests share."""

from __future__ import annotations

import textwrap

import pytest
from support.adapter_cells import flag as _flag
from support.adapter_cells import small_cell as _cell

from harness.config import CellConfig, load_config
from harness.servers import (
    get_adapter,
)
from harness.servers.metrics import SGLANG_RULES, map_metrics, parse_prometheus
from harness.servers.sglang import SGLangAdapter
from harness.servers.vllm import ENGINE_CACHE_ENV, VLLMAdapter


@pytest.fixture(autouse=True)
def _no_engine_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch environments are asserted whole, so the caller's engine cache (CI exports one for the
    real-engine tests) must not leak in; test_vllm_launch_command_engine_cache sets it on purpose."""
    monkeypatch.delenv(ENGINE_CACHE_ENV, raising=False)


def _sglang_cell(**over: object) -> CellConfig:
    return _cell(engine={"name": "sglang", "version": "0.5.22"}, page_size=1, **over)


def test_sglang_cpu_launch_comes_from_the_cell() -> None:
    """A CPU cell carries device and mem_fraction_static; the adapter turns them into --device,
    --mem-fraction-static and SGLANG_USE_CPU_ENGINE=1 (without which --device cpu needs vLLM's
    kernels, and without an explicit fraction the derived one was negative: no start)."""
    cpu = _sglang_cell(device="cpu", mem_fraction_static=0.5, attention_backend="torch_native")
    argv, env = SGLangAdapter().launch_command(cpu, model="/m", host="127.0.0.1", port=1)
    assert _flag(argv, "--device") == "cpu" and _flag(argv, "--mem-fraction-static") == "0.5"
    assert env == {"SGLANG_USE_CPU_ENGINE": "1"}
    settings = SGLangAdapter().expected_settings(cpu)
    assert (
        settings["device"] == "cpu"
        and settings["mem_fraction_static"] == 0.5
        and settings["radix_eviction_policy"] == "lru"
    )
    # GPU cells (every paper cell): the argv of record, no CPU engine, nothing more to verify
    paper = load_config("cells/sglang-a100-300k", CellConfig)
    assert paper.device is None and paper.mem_fraction_static is None
    argv, env = SGLangAdapter().launch_command(paper, model="/m", host="127.0.0.1", port=1)
    assert "--device" not in argv and "--mem-fraction-static" not in argv and env == {}
    assert {"device", "mem_fraction_static"}.isdisjoint(SGLangAdapter().expected_settings(paper))
    gpu = _sglang_cell(device="cuda")
    argv, env = SGLangAdapter().launch_command(gpu, model="/m", host="127.0.0.1", port=1)
    assert _flag(argv, "--device") == "cuda" and env == {}


def test_cell_checks_mem_fraction_and_vllm_refuses_it() -> None:
    from harness.config import parse_config
    from harness.errors import ConfigError

    data = {
        "name": "t",
        "engine": {"name": "sglang", "version": "0.5.22"},
        "model": "m",
        "gpu": "cpu",
        "kv_pool_tokens": 10,
        "mem_fraction_static": 1.5,
    }
    with pytest.raises(ConfigError, match="mem_fraction_static"):
        parse_config(data, CellConfig)
    with pytest.raises(ValueError, match="mem_fraction_static is SGLang's"):
        VLLMAdapter().launch_command(_cell(mem_fraction_static=0.5), model="m", host="h", port=1)
    argv, _ = VLLMAdapter().launch_command(_cell(device="cpu"), model="m", host="h", port=1)
    assert "--device" not in argv  # vLLM 0.32 has no --device: the installed build decides


def test_longest_prompt_per_engine() -> None:
    """SGLang refuses n >= min(context - 1, pool - 1) - 5 and n + max_tokens > context (measured:
    8,191 and 8,186 refused, 8,185 taken with context 8,192, pool 32,768); vLLM only the latter."""
    assert SGLangAdapter().max_prompt_tokens(_sglang_cell(context_length=8192, kv_pool_tokens=32768), 1) == 8185
    assert SGLangAdapter().max_prompt_tokens(_sglang_cell(context_length=8192, kv_pool_tokens=32768), 100) == 8092
    assert (
        SGLangAdapter().max_prompt_tokens(_sglang_cell(context_length=49152, kv_pool_tokens=4096), 1) == 4089
    )  # the pool binds
    paper = load_config("cells/sglang-a100-300k", CellConfig)
    assert SGLangAdapter().max_prompt_tokens(paper, 1) >= 40_350  # the workload's longest prompt fits
    assert VLLMAdapter().max_prompt_tokens(_cell(context_length=8192), 1) == 8191
    assert get_adapter("emulator:sglang").max_prompt_tokens(_sglang_cell(), 1) == 8185


SGLANG_0522_METRICS = textwrap.dedent(
    """\
    # TYPE sglang:num_running_reqs gauge
    sglang:num_running_reqs{engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
    # TYPE sglang:num_queue_reqs gauge
    sglang:num_queue_reqs{engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
    # TYPE sglang:token_usage gauge
    sglang:token_usage{engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
    # TYPE sglang:kv_used_tokens gauge
    sglang:kv_used_tokens{engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
    # TYPE sglang:kv_evictable_tokens gauge
    sglang:kv_evictable_tokens{engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 8423.0
    # TYPE sglang:max_total_num_tokens gauge
    sglang:max_total_num_tokens{engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 32768.0
    # TYPE sglang:num_retracted_reqs gauge
    """
    'sglang:num_retracted_reqs{engine_type="unified",model_name="tiny",moe_ep_rank="0",pid="13878",'
    'pp_rank="0",tp_rank="0"} 0.0\n'
    """\
    # TYPE sglang:prompt_tokens counter
    sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="tiny"} 16247.0
    sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="tiny"} 30.0
    # TYPE sglang:generation_tokens counter
    sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="tiny"} 4904.0
    sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="tiny"} 4.0
    """
)


def test_sglang_0522_scrape_before_a_hit_and_without_retractions() -> None:
    """The labels of a real 0.5.22 scrape (from the probe): the tokenizer's counters summed over
    is_streaming; cached_tokens_total and the retraction counter absent until first incremented,
    so the columns read 0, not missing; a hit then gives the counter (with cache_source)."""
    m = map_metrics(parse_prometheus(SGLANG_0522_METRICS), SGLANG_RULES)
    assert m["prompt_tokens_total"] == 16277.0 and m["generation_tokens_total"] == 4908.0
    assert m["cached_tokens_total"] == 0.0 and m["preemptions_total"] == 0.0
    assert m["pool_tokens"] == 32768.0 and m["kv_evictable_tokens"] == 8423.0 and m["kv_used_tokens"] == 0.0
    hit = SGLANG_0522_METRICS + textwrap.dedent(
        """\
        # TYPE sglang:cached_tokens counter
        sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="tiny"} 6280.0
        """
    )
    assert map_metrics(parse_prometheus(hit), SGLANG_RULES)["cached_tokens_total"] == 6280.0
    # a retraction report without the cumulative counter (not 0.5.22): unknown, not a made-up count
    odd = SGLANG_0522_METRICS.replace(
        'pid="13878",pp_rank="0",tp_rank="0"} 0.0', 'pid="13878",pp_rank="0",tp_rank="0"} 2.0'
    )
    assert "preemptions_total" not in map_metrics(parse_prometheus(odd), SGLANG_RULES)
    # before any request finished the tokenizer has no series at all: both columns missing
    bare = "\n".join(
        line for line in SGLANG_0522_METRICS.splitlines() if "tokens_total" not in line and "tokens counter" not in line
    )
    assert {"prompt_tokens_total", "cached_tokens_total"}.isdisjoint(map_metrics(parse_prometheus(bare), SGLANG_RULES))
