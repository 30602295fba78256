"""Engine /metrics (Prometheus text) -> the run's gauge table, under names common to all engines.

Why common names: the analysis (backlog, KV pressure, preemptions) must read one column whatever
engine produced the run. Parsing uses prometheus_client's parser, never regexes, because label
values may contain spaces, commas and escaped quotes, and counters come with _created siblings.

Aggregation across label sets: series from several engines / DP ranks (vLLM `engine`, SGLang
`dp_rank`) are summed; series repeated per tensor-parallel rank (SGLang `tp_rank`) describe the
same pool, so only rank 0 is kept. Fractions are averaged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# The gauge table's columns. A name missing from a scrape means the engine does not export it.
COMMON_METRICS: tuple[str, ...] = (
    "running",  # requests being computed
    "waiting",  # requests queued in the engine
    "kv_used_tokens",  # KV held by requests in flight (not reusable idle cache)
    "kv_evictable_tokens",  # idle cached KV that eviction may reclaim
    "pool_tokens",  # KV pool capacity, tokens
    "kv_usage_frac",  # engine's own usage fraction (0-1)
    "prompt_tokens_total",  # counters from here on
    "cached_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (counters keep their _total suffix)."""
    out: list[Sample] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append(Sample(s.name, dict(s.labels), float(s.value)))
    return out


def _keep(labels: Mapping[str, str]) -> bool:
    return labels.get("tp_rank", "0") == "0"


def series(samples: list[Sample], name: str, *, reduce: str = "sum") -> float | None:
    """Aggregate one series over its label sets; None when the engine does not export it."""
    vals = [s.value for s in samples if s.name == name and _keep(s.labels)]
    if not vals:
        return None
    if reduce == "mean":
        return sum(vals) / len(vals)
    if reduce == "max":
        return max(vals)
    return sum(vals)


def first(*names: str, reduce: str = "sum") -> Callable[[list[Sample], dict[str, float]], float | None]:
    """The first of several series names the engine exports (names changed across versions)."""

    def get(samples: list[Sample], _out: dict[str, float]) -> float | None:
        for n in names:
            v = series(samples, n, reduce=reduce)
            if v is not None:
                return v
        return None

    return get


Rule = Callable[[list[Sample], dict[str, float]], "float | None"]


def map_metrics(samples: list[Sample], rules: Mapping[str, Rule]) -> dict[str, float]:
    """Apply an engine's rules in order; later rules may derive from earlier outputs."""
    out: dict[str, float] = {}
    for common, rule in rules.items():
        v = rule(samples, out)
        if v is not None:
            out[common] = float(v)
    return out


# ------------------------------------------------------------------------------------------
# vLLM (V1): usage is a fraction of blocks held by requests; the pool size comes from the labels
# of cache_config_info; cached-but-free blocks are not exported, so kv_evictable_tokens is absent.
# ------------------------------------------------------------------------------------------
def _vllm_pool(samples: list[Sample], _out: dict[str, float]) -> float | None:
    total = 0.0
    found = False
    for s in samples:
        if s.name == "vllm:cache_config_info":
            try:
                total += int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"])
                found = True
            except (KeyError, ValueError):
                continue
    return total if found else None


def _vllm_used(_samples: list[Sample], out: dict[str, float]) -> float | None:
    if "kv_usage_frac" in out and "pool_tokens" in out:
        return round(out["kv_usage_frac"] * out["pool_tokens"])
    return None


VLLM_RULES: dict[str, Rule] = {
    "running": first("vllm:num_requests_running"),
    "waiting": first("vllm:num_requests_waiting"),
    "pool_tokens": _vllm_pool,
    "kv_usage_frac": first("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", reduce="mean"),
    "kv_used_tokens": _vllm_used,
    "prompt_tokens_total": first("vllm:prompt_tokens_total"),
    "cached_tokens_total": first("vllm:prompt_tokens_cached_total", "vllm:prefix_cache_hits_total"),
    "generation_tokens_total": first("vllm:generation_tokens_total"),
    "preemptions_total": first("vllm:num_preemptions_total"),
}


# ------------------------------------------------------------------------------------------
# SGLang: token_usage EXCLUDES evictable cached KV; kv_* gauges exist in newer releases only, so
# kv_used_tokens falls back to token_usage x pool. Retractions are SGLang's preemptions. Scheduler
# gauges carry engine_type, model_name, moe_ep_rank, pp_rank, tp_rank; the tokenizer's counters
# carry engine_type, model_name and is_streaming (one series per value seen), cached_tokens_total
# cache_source instead: the sums over label sets are the totals. The scheduler gauges are as of its
# last report (each prefill batch, every 40th decode step, on falling idle, every 30 s idle), not
# of the scrape: an idle server's flush shows in kv_evictable_tokens only at its next report.
# ------------------------------------------------------------------------------------------
def _sglang_used(samples: list[Sample], out: dict[str, float]) -> float | None:
    v = series(samples, "sglang:kv_used_tokens")
    if v is not None:
        return v
    if "kv_usage_frac" in out and "pool_tokens" in out:
        return round(out["kv_usage_frac"] * out["pool_tokens"])
    return None


def _sglang_cached(samples: list[Sample], out: dict[str, float]) -> float | None:
    """sglang:cached_tokens_total, or 0 where the engine has counted prompts but no hit yet.

    The counter is labelled (cache_source), and a labelled Prometheus child exists only once it
    was incremented: SGLang 0.5.22 exports it after the first cache hit, and never with the radix
    cache off. Its absence beside a present prompt counter therefore means zero hits, not an
    engine that cannot report them.
    """
    v = series(samples, "sglang:cached_tokens_total")
    if v is not None:
        return v
    return 0.0 if "prompt_tokens_total" in out else None


def _sglang_retractions(samples: list[Sample], _out: dict[str, float]) -> float | None:
    """Cumulative retractions: sglang:num_retracted_requests_total, else 0 when none happened.

    Like cached_tokens_total, the counter appears with the first retraction. The gauge
    sglang:num_retracted_reqs (per scheduler report, with a `pid` label) is not cumulative, so it
    only tells "none yet" (every series 0) from "unknown" (a positive report without the counter,
    which 0.5.22 never shows: the counter is incremented in the same place).
    """
    v = series(samples, "sglang:num_retracted_requests_total")
    if v is not None:
        return v
    gauge = [s.value for s in samples if s.name == "sglang:num_retracted_reqs" and _keep(s.labels)]
    if gauge and all(x == 0 for x in gauge):
        return 0.0
    return None


SGLANG_RULES: dict[str, Rule] = {
    "running": first("sglang:num_running_reqs"),
    "waiting": first("sglang:num_queue_reqs"),
    "pool_tokens": first("sglang:max_total_num_tokens"),
    "kv_usage_frac": first("sglang:token_usage", reduce="mean"),
    "kv_used_tokens": _sglang_used,
    "kv_evictable_tokens": first("sglang:kv_evictable_tokens"),
    "prompt_tokens_total": first("sglang:prompt_tokens_total"),
    "cached_tokens_total": _sglang_cached,
    "generation_tokens_total": first("sglang:generation_tokens_total"),
    "preemptions_total": _sglang_retractions,
}

RULES: dict[str, dict[str, Rule]] = {"vllm": VLLM_RULES, "sglang": SGLANG_RULES}
