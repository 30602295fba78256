"""The two engines' HTTP dialects, as the emulator speaks them.

The harness must not be able to tell the emulator from the engine it imitates in the fields it
reads, so every difference the client or an adapter could trip over is reproduced here: SGLang
leaves `usage.prompt_tokens_details` out entirely when nothing was cached (and only counts hits
because the server runs with cache reporting on); vLLM always reports the details block and counts
whole blocks. Metric names, label sets and error bodies follow the engines' own sources so that the
adapters' Prometheus parsing is exercised for real.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

FLAVORS = ("sglang", "vllm")


def _choice(flavor: str, output_ids: np.ndarray, prompt_ids: np.ndarray | None, return_ids: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": fake_text(output_ids),
        "logprobs": None,
        "finish_reason": "length",
    }
    if flavor == "sglang":
        choice["matched_stop"] = None
    else:
        choice["stop_reason"] = None
        choice["prompt_logprobs"] = None
    if return_ids:
        choice["token_ids"] = output_ids
        choice["prompt_token_ids"] = prompt_ids
    return choice


def fake_text(ids: np.ndarray) -> str:
    """Words of the test vocabulary (`w<id>`), the same words the tiny model's tokenizer uses."""
    return " ".join(f"w{int(i)}" for i in ids[:8]) if len(ids) else ""


def completion_body(
    flavor: str,
    *,
    model: str,
    prompt_ids: np.ndarray,
    output_ids: np.ndarray,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    return_ids: bool,
    with_usage: bool = True,
) -> dict[str, Any]:
    """A non-streamed /v1/completions response (numpy arrays are serialised by orjson directly)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if flavor == "sglang":
        if cached_tokens > 0:  # SGLang keeps the JSON slim: no details object at zero hits
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        usage["reasoning_tokens"] = 0
    else:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    body: dict[str, Any] = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(flavor, output_ids, prompt_ids, return_ids)],
    }
    if with_usage:
        body["usage"] = usage
    if flavor == "vllm":
        body["service_tier"] = None
        body["system_fingerprint"] = None
        body["kv_transfer_params"] = None
    return body


def stream_chunks(flavor: str, body: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """SSE chunks for `stream: true`: one per output token's worth of text is not needed by any
    client we serve (the benchmark's reference client only times the first and last chunk), so the
    text arrives in two chunks, then an optional usage chunk."""
    choice = body["choices"][0]
    base = {"id": body["id"], "object": "text_completion", "created": body["created"], "model": body["model"]}
    words = choice["text"].split(" ")
    head, tail = words[:1], words[1:]
    first = {"index": 0, "text": " ".join(head), "logprobs": None, "finish_reason": None}
    last = {"index": 0, "text": (" " + " ".join(tail)) if tail else "", "logprobs": None, "finish_reason": "length"}
    if "token_ids" in choice:
        ids = choice["token_ids"]
        first["token_ids"], last["token_ids"] = ids[:1], ids[1:]
    yield {**base, "choices": [first]}
    yield {**base, "choices": [last]}
    if include_usage and "usage" in body:
        yield {**base, "choices": [], "usage": body["usage"]}


def generate_body(*, output_ids: np.ndarray, prompt_tokens: int, cached_tokens: int, completion_tokens: int, latency: float) -> dict[str, Any]:
    """SGLang's native /generate response: ids and counts under meta_info (no cache flag needed)."""
    return {
        "text": fake_text(output_ids),
        "output_ids": output_ids,
        "meta_info": {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": completion_tokens},
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "e2e_latency": latency,
        },
    }


def error_body(flavor: str, message: str, status: int = 400, kind: str = "BadRequestError") -> dict[str, Any]:
    """The engines' error envelopes: SGLang's flat ErrorResponse, vLLM's nested `error` object."""
    if flavor == "sglang":
        return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def context_error(flavor: str, prompt_len: int, max_tokens: int, context: int) -> str:
    if flavor == "sglang":
        return (
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context} tokens)."
        )
    return (
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the completion). "
        "Please reduce the length of the messages or completion."
    )


def models_body(model: str, context: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": int(time.time()), "owned_by": "agentload-emulator", "root": model, "max_model_len": context}],
    }


def server_info(flavor: str, *, model: str, cell: Any, time_scale: float, version: str) -> dict[str, Any]:
    """SGLang's /server_info keys the harness reads (pool size, policy, page size), plus provenance."""
    common = {
        "model_path": model,
        "served_model_name": model,
        "version": version,
        "emulator": True,
        "cell": cell.name,
        "time_scale": time_scale,
    }
    if flavor == "sglang":
        return {
            **common,
            "max_total_num_tokens": cell.kv_pool_tokens,
            "max_total_tokens": cell.kv_pool_tokens,
            "page_size": cell.page_size,
            "schedule_policy": cell.schedule_policy,
            "chunked_prefill_size": cell.chunked_prefill,
            "max_running_requests": cell.max_running,
            "disable_radix_cache": not cell.prefix_cache,
            "context_length": cell.context_length,
            "enable_cache_report": True,
            "enable_metrics": True,
        }
    return {
        **common,
        "block_size": cell.page_size,
        "num_gpu_blocks": cell.kv_pool_tokens // cell.page_size,
        "enable_prefix_caching": cell.prefix_cache,
        "max_num_seqs": cell.max_running,
        "max_num_batched_tokens": cell.chunked_prefill,
        "max_model_len": cell.context_length,
    }


class EngineCollector(Collector):
    """Builds the engine's metric families from the model's gauges at scrape time.

    A collector (instead of Gauge objects updated on every iteration) keeps the hot loop free of
    metric bookkeeping and guarantees the scrape shows one consistent snapshot.
    """

    def __init__(self, flavor: str, model_name: str, cell: Any, snapshot: Any) -> None:
        self.flavor = flavor
        self.model_name = model_name
        self.cell = cell
        self.snapshot = snapshot  # () -> dict of the model's gauges plus the server's own counters

    def collect(self) -> Iterator[Any]:
        g = self.snapshot()
        if self.flavor == "sglang":
            yield from self._sglang(g)
        else:
            yield from self._vllm(g)

    def _sglang(self, g: dict[str, float]) -> Iterator[Any]:
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        values = [self.model_name, "unified", "0", "0"]
        pool = float(g.get("pool_tokens", self.cell.kv_pool_tokens))
        used = float(g.get("kv_used_tokens", 0))
        evictable = float(g.get("kv_evictable_tokens", 0))
        prompt_total = float(g.get("prompt_tokens_total", 0))
        cached_total = float(g.get("cached_tokens_total", 0))

        gauge, counter = _family_makers("sglang", labels, values)

        yield gauge("num_running_reqs", "The number of running requests.", g.get("running", 0))
        yield gauge("num_queue_reqs", "The number of requests in the waiting queue.", g.get("waiting", 0))
        yield gauge("token_usage", "The token usage (excludes evictable cached tokens).", used / pool if pool else 0.0)
        yield gauge("kv_used_tokens", "KV pool tokens held by requests.", used)
        yield gauge("kv_available_tokens", "Free KV pool tokens.", max(pool - used - evictable, 0.0))
        yield gauge("kv_evictable_tokens", "Cached KV pool tokens no request holds.", evictable)
        yield gauge("cache_hit_rate", "The prefix cache hit rate.", cached_total / prompt_total if prompt_total else 0.0)
        yield gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.", pool)
        yield counter("prompt_tokens", "Number of prefill tokens processed.", prompt_total)
        yield counter("generation_tokens", "Number of generation tokens processed.", g.get("generation_tokens_total", 0))
        yield counter("cached_tokens", "Number of cached prompt tokens.", cached_total)
        yield counter("num_retracted_requests", "Number of retracted requests.", g.get("preemptions_total", 0))

    def _vllm(self, g: dict[str, float]) -> Iterator[Any]:
        labels = ["engine", "model_name"]
        values = ["0", self.model_name]
        pool = float(g.get("pool_tokens", self.cell.kv_pool_tokens))
        used = float(g.get("kv_used_tokens", 0))

        gauge, counter = _family_makers("vllm", labels, values)

        yield gauge("num_requests_running", "Number of requests in model execution batches.", g.get("running", 0))
        yield gauge("num_requests_waiting", "Number of requests waiting to be processed.", g.get("waiting", 0))
        yield gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", used / pool if pool else 0.0)
        yield counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", g.get("prompt_tokens_total", 0))
        yield counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", g.get("cached_tokens_total", 0))
        yield counter("prompt_tokens_cached", "Number of cached prompt tokens (local prefix cache hits).", g.get("cached_tokens_total", 0))
        yield counter("prompt_tokens", "Number of prefill tokens processed.", g.get("prompt_tokens_total", 0))
        yield counter("generation_tokens", "Number of generation tokens processed.", g.get("generation_tokens_total", 0))
        yield counter("num_preemptions", "Cumulative number of preemption from the engine.", g.get("preemptions_total", 0))
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"],
        )
        info.add_metric(
            [str(self.cell.page_size), str(self.cell.kv_pool_tokens // self.cell.page_size), str(self.cell.prefix_cache), "0"],
            1.0,
        )
        yield info


def _family_makers(prefix: str, labels: list[str], values: list[str]) -> tuple[Any, Any]:
    """One-sample gauge and counter families under an engine's metric prefix and label set."""

    def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
        m = GaugeMetricFamily(f"{prefix}:{name}", doc, labels=labels)
        m.add_metric(values, v)
        return m

    def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
        m = CounterMetricFamily(f"{prefix}:{name}", doc, labels=labels)
        m.add_metric(values, v)
        return m

    return gauge, counter
