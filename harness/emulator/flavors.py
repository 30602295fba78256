"""The two engines' HTTP dialects, as the emulator speaks them.

The harness must not be able to tell the emulator from the engine it imitates in the fields it
reads, so every difference the client or an adapter could trip over is reproduced here, as
measured on SGLang 0.5.22 and vLLM 0.32 (docs/sglang-cpu.md): both report
`usage.prompt_tokens_details` on every completion (SGLang with --enable-cache-report, also when
nothing was cached), SGLang counts hits per page and vLLM per block; SGLang refuses a prompt at
three limits with three messages; SGLang's tokenizer counters exist only once incremented (so
`sglang:cached_tokens_total` is absent before the first hit) and its scheduler gauges and its
tokenizer counters carry different label sets. Metric names, label sets and error bodies follow
the engines' own sources so that the adapters' Prometheus parsing is exercised for real.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

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
    usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}  # also at 0 (SGLang with --enable-cache-report)
    if flavor == "sglang":
        usage["reasoning_tokens"] = 0
    else:  # vLLM 0.32's usage, as it answered
        usage["prompt_tokens_details"].update(created_cache_tokens=None, multimodal_tokens=None)
        usage["completion_tokens_details"] = None
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
    else:
        body["metadata"] = weight_metadata(completion_tokens)
    return body


def weight_metadata(completion_tokens: int) -> dict[str, Any]:
    """SGLang's `metadata`: which weights produced which output tokens (one version here)."""
    return {
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": completion_tokens}],
    }


def stream_base(model: str) -> dict[str, Any]:
    """The fields every SSE chunk of one streamed completion repeats."""
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": model}


def token_chunk(
    flavor: str,
    base: dict[str, Any],
    ids: np.ndarray,
    *,
    first: bool,
    last: bool,
    prompt_ids: np.ndarray | None,
    return_ids: bool,
) -> dict[str, Any]:
    """One SSE chunk carrying the tokens `ids` (one per decode step as the engines stream them; more
    when a client's read lags): their words as text, the finish reason on the last chunk.

    SGLang 0.5.22: `matched_stop` and `usage: null` in every chunk, `token_ids` (and the prompt's ids
    in the first chunk only) when return_token_ids. vLLM 0.32 (exclude_unset): `stop_reason`,
    `token_ids` and `prompt_token_ids` always present, null when not asked for or after the first."""
    c: dict[str, Any] = {
        "index": 0,
        "text": "".join(f" w{int(i)}" for i in ids),
        "logprobs": None,
        "finish_reason": "length" if last else None,
    }
    if flavor == "sglang":
        c["matched_stop"] = None
        if return_ids:
            c["token_ids"] = ids
            if first:
                c["prompt_token_ids"] = prompt_ids
        return {**base, "choices": [c], "usage": None}
    c["stop_reason"] = None
    c["prompt_token_ids"] = prompt_ids if (return_ids and first) else None
    c["token_ids"] = ids if return_ids else None
    return {**base, "choices": [c]}


def usage_chunk(
    flavor: str, base: dict[str, Any], usage: dict[str, Any], metrics: dict[str, Any] | None
) -> dict[str, Any]:
    """The last chunk of a stream asked for with stream_options.include_usage: no choices, the usage;
    vLLM (--enable-per-request-metrics, as the adapter launches it) adds the request's `metrics`."""
    out: dict[str, Any] = {**base, "choices": [], "usage": usage}
    if flavor == "vllm" and metrics is not None:
        out["metrics"] = metrics
    return out


def vllm_metrics(queue: float, ttft: float, decode: float, tokens: int) -> dict[str, float | None]:
    """vLLM 0.32's per-request timing metrics (build_per_request_timing_metrics), in ms, from the
    request's queue time (queued -> scheduled), scheduled -> first token and first -> last token."""
    return {
        "time_to_first_token_ms": ttft * 1000.0,
        "generation_time_ms": decode * 1000.0,
        "queue_time_ms": queue * 1000.0,
        "mean_itl_ms": decode / (tokens - 1) * 1000.0 if tokens > 1 else None,
        "tokens_per_second": tokens / (ttft + decode) if ttft + decode > 0 else None,
    }


def generate_body(
    *,
    output_ids: np.ndarray,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    latency: float,
    received: float | None = None,
    queue_time: float = 0.0,
    first_token_latency: float | None = None,
    forward_entry: float | None = None,
    prefill_finished: float | None = None,
) -> dict[str, Any]:
    """SGLang's native /generate response: ids and counts under meta_info (no cache flag needed).

    meta_info carries the keys 0.5.22 sends without a hierarchical cache, speculative decoding or
    data parallelism (those are null or 0 there too), with --enable-metrics (as the adapter
    launches it) its scheduler's timings too: `queue_time` (seconds waiting), `forward_entry_time`
    (scheduled) and `prefill_finished_time` (first token), epoch seconds; `received` is the wall time
    (epoch seconds) the request arrived, `latency` the seconds until its last token.
    """
    ftl = latency if first_token_latency is None else first_token_latency
    received = time.time() - latency if received is None else received
    finished = received + latency
    scheduler = {}
    if forward_entry is not None and prefill_finished is not None:
        scheduler = {"forward_entry_time": forward_entry, "prefill_finished_time": prefill_finished}
    return {
        "text": fake_text(output_ids),
        "output_ids": output_ids,
        "meta_info": {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": completion_tokens},
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "queue_time": queue_time,
            "reasoning_tokens": 0,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "weight_versions": weight_metadata(completion_tokens)["weight_versions"],
            "cached_tokens_details": None,
            "dp_rank": None,
            "e2e_latency": latency,
            "request_received_ts": received,
            "first_token_latency": ftl,
            "request_finished_ts": finished,
            "decode_throughput": (completion_tokens - 1) / (latency - ftl)
            if completion_tokens > 1 and latency > ftl
            else 0.0,
            "response_sent_to_client_ts": finished,
            **scheduler,
        },
    }


def error_body(
    flavor: str, message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None
) -> dict[str, Any]:
    """The engines' error envelopes: SGLang's flat ErrorResponse, vLLM's nested `error` object
    (whose `param` names the rejected request field when vLLM's validation knows it)."""
    if flavor == "sglang":
        return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def sglang_max_input(context: int, pool: int) -> int:
    """SGLang's scheduler limit max_req_input_len: min(context - 1, pool - 1) - 5 (tp_worker.py)."""
    return min(context - 1, pool - 1) - 5


def refusal(flavor: str, prompt_len: int, max_tokens: int, context: int, pool: int) -> tuple[str, str | None] | None:
    """(message, rejected parameter) of the 400 the engine answers for a request it will not take;
    None when it takes it.

    SGLang checks, in this order: the tokenizer manager refuses n >= context, then n + max_tokens >
    context; the scheduler then refuses n >= max_req_input_len (a margin below the context, or the
    pool when that is smaller). vLLM 0.32 refuses only a prompt longer than the context, and a
    prompt of exactly the context (no room for one output token: its max_tokens becomes 0); a
    prompt and completion over the context are served with max_tokens cut (served_max_tokens).
    """
    n, m = prompt_len, max_tokens
    if flavor == "sglang":
        if n >= context:
            return f"The input ({n} tokens) is longer than the model's context length ({context} tokens).", None
        if n + m > context:
            return (
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {n + m} tokens: {n} tokens from the input messages and {m} tokens "
                "for the completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            ), None
        limit = sglang_max_input(context, pool)
        if n >= limit:
            return (
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            ), None
        return None
    if n > context:
        qualifier = "at least " if n == context + 1 else ""  # vLLM cannot tell a prompt it cut at context + 1
        return (
            f"This model's maximum context length is {context} tokens. However, your prompt contains "
            f"{qualifier}{n} input tokens, which exceeds this limit even without any output tokens. "
            f"Please reduce the length of the input prompt. (parameter=input_tokens, value={n})"
        ), "input_tokens"
    if n == context:
        return "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"
    return None


def served_max_tokens(flavor: str, prompt_len: int, max_tokens: int, context: int) -> int:
    """How many tokens the engine will generate for a request it took: vLLM cuts max_tokens to
    what is left of the context (its get_max_tokens); SGLang refused the request instead."""
    return min(max_tokens, context - prompt_len) if flavor == "vllm" else max_tokens


def models_body(model: str, context: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "agentload-emulator",
                "root": model,
                "max_model_len": context,
            }
        ],
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
        # 0.5.22 puts every server argument at the top level and the scheduler's view (a copy of the
        # arguments plus runtime facts) in internal_states, one dict per scheduler.
        args = {
            "max_total_tokens": cell.kv_pool_tokens,
            "page_size": cell.page_size,
            "schedule_policy": cell.schedule_policy,
            "chunked_prefill_size": cell.chunked_prefill,
            "max_running_requests": cell.max_running,
            "max_prefill_tokens": 16384,
            "disable_radix_cache": not cell.prefix_cache,
            "radix_eviction_policy": "lru",
            "context_length": cell.context_length,
            "enable_cache_report": True,
            "enable_metrics": True,
            "attention_backend": cell.attention_backend,
            "device": cell.device or "cuda",
            "mem_fraction_static": cell.mem_fraction_static,
            "schedule_conservativeness": 1.0,
            "tp_size": 1,
            "dp_size": 1,
            "allow_auto_truncate": False,
        }
        return {
            **common,
            **args,
            "max_total_num_tokens": cell.kv_pool_tokens,
            "internal_states": [
                {
                    **args,
                    "model_path": model,
                    "max_total_num_tokens": cell.kv_pool_tokens,
                    "max_req_input_len": sglang_max_input(cell.context_length, cell.kv_pool_tokens),
                }
            ],
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

    def _sglang(self, g: dict[str, Any]) -> Iterator[Any]:
        """SGLang 0.5.22's families: scheduler gauges with the scheduler's labels; the tokenizer's
        counters (one series per is_streaming value seen) and the cached-token counter with its
        cache_source, each present only once incremented, like any labelled Prometheus child; the
        retraction counter only after a retraction, the per-report gauge beside it with a pid."""
        sched = ["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"]
        sched_v = ["unified", self.model_name, "0", "0", "0"]
        pool = float(g.get("pool_tokens", self.cell.kv_pool_tokens))
        used = float(g.get("kv_used_tokens", 0))
        evictable = float(g.get("kv_evictable_tokens", 0))

        gauge, counter = _family_makers("sglang", sched, sched_v)

        yield gauge("num_running_reqs", "The number of running requests.", g.get("running", 0))
        yield gauge("num_queue_reqs", "The number of requests in the waiting queue.", g.get("waiting", 0))
        yield gauge("token_usage", "The token usage (excludes evictable cached tokens).", used / pool if pool else 0.0)
        yield gauge("num_used_tokens", "The number of used tokens.", used)
        yield gauge("kv_used_tokens", "KV pool tokens held by requests.", used)
        yield gauge("kv_available_tokens", "Free KV pool tokens.", max(pool - used - evictable, 0.0))
        yield gauge("kv_evictable_tokens", "Cached KV pool tokens no request holds.", evictable)
        yield gauge(
            "cache_hit_rate", "The prefix cache hit rate (of the latest prefill batch).", g.get("cache_hit_rate", 0.0)
        )
        yield gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.", pool)
        yield gauge("page_size", "The page size of the KV pool.", float(self.cell.page_size))
        yield gauge("num_pages", "The number of pages in the KV pool.", float(int(pool) // self.cell.page_size))
        yield gauge("context_len", "The context length.", float(self.cell.context_length))
        retracted = GaugeMetricFamily(
            "sglang:num_retracted_reqs", "The number of retracted requests.", labels=[*sched, "pid"]
        )
        retracted.add_metric([*sched_v, str(g.get("pid", 0))], float(g.get("retracted_report", 0)))
        yield retracted
        if g.get("preemptions_total", 0) > 0:
            yield counter("num_retracted_requests", "Total number of retracted requests.", g["preemptions_total"])

        tok = ["engine_type", "is_streaming", "model_name"]
        families = {
            "prompt_tokens": CounterMetricFamily(
                "sglang:prompt_tokens", "Number of prefill tokens processed.", labels=tok
            ),
            "generation_tokens": CounterMetricFamily(
                "sglang:generation_tokens", "Number of generation tokens processed.", labels=tok
            ),
            "num_requests": CounterMetricFamily("sglang:num_requests", "Number of requests processed.", labels=tok),
        }
        seen = False
        for streaming, counts in sorted((g.get("tokenizer") or {}).items()):
            if not counts.get("num_requests"):
                continue
            seen = True
            for key, fam in families.items():
                fam.add_metric(["unified", streaming, self.model_name], float(counts.get(key, 0)))
        if seen:
            yield from families.values()
        cached = float(g.get("tokenizer_cached", 0))
        if cached > 0:
            fam = CounterMetricFamily(
                "sglang:cached_tokens",
                "Number of cached prompt tokens.",
                labels=["cache_source", "engine_type", "model_name"],
            )
            fam.add_metric(["device", "unified", self.model_name], cached)
            yield fam

    def _vllm(self, g: dict[str, float]) -> Iterator[Any]:
        labels = ["engine", "model_name"]
        values = ["0", self.model_name]
        pool = float(g.get("pool_tokens", self.cell.kv_pool_tokens))
        used = float(g.get("kv_used_tokens", 0))

        gauge, counter = _family_makers("vllm", labels, values)

        yield gauge("num_requests_running", "Number of requests in model execution batches.", g.get("running", 0))
        yield gauge("num_requests_waiting", "Number of requests waiting to be processed.", g.get("waiting", 0))
        yield gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", used / pool if pool else 0.0)
        yield counter(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            g.get("prompt_tokens_total", 0),
        )
        yield counter(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            g.get("cached_tokens_total", 0),
        )
        yield counter(
            "prompt_tokens_cached",
            "Number of cached prompt tokens (local prefix cache hits).",
            g.get("cached_tokens_total", 0),
        )
        yield counter("prompt_tokens", "Number of prefill tokens processed.", g.get("prompt_tokens_total", 0))
        yield counter(
            "generation_tokens", "Number of generation tokens processed.", g.get("generation_tokens_total", 0)
        )
        yield counter(
            "num_preemptions", "Cumulative number of preemption from the engine.", g.get("preemptions_total", 0)
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"],
        )
        info.add_metric(
            [
                str(self.cell.page_size),
                str(self.cell.kv_pool_tokens // self.cell.page_size),
                str(self.cell.prefix_cache),
                "0",
            ],
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
