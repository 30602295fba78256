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
from typing import TypeVar

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


Rule = Callable[[list[Sample], dict[str, float]], "float | None"]
_R = TypeVar("_R", bound=Callable[..., object])


def reads(*names: str, labels: tuple[str, ...] = ()) -> Callable[[_R], _R]:
    """Declare the series (and labels) a rule reads, so a check inside each engine's venv can confirm
    that the engine's source defines them (harness/servers/launchcheck.py): a renamed series would
    otherwise only show as a missing gauge column in a run on that engine."""

    def mark(fn: _R) -> _R:
        fn.reads = tuple(names)  # type: ignore[attr-defined]
        fn.reads_labels = tuple(labels)  # type: ignore[attr-defined]
        return fn

    return mark


def first(*names: str, reduce: str = "sum") -> Rule:
    """The first of several series names the engine exports (names changed across versions)."""

    @reads(*names)
    def get(samples: list[Sample], _out: dict[str, float]) -> float | None:
        for n in names:
            v = series(samples, n, reduce=reduce)
            if v is not None:
                return v
        return None

    return get


def derived(fn: _R) -> _R:
    """A rule computed from earlier outputs only: it reads no series of its own."""
    return reads()(fn)


def names_read(rules: Mapping[str, Rule]) -> dict[str, tuple[str, ...]]:
    """Each common name -> the engine series its rule reads, in the order it tries them (fallbacks
    for older releases after the current name). A rule that declares nothing is an error: the check
    of the engines' sources would silently skip it."""
    out: dict[str, tuple[str, ...]] = {}
    for common, rule in rules.items():
        names = getattr(rule, "reads", None)
        if names is None:
            raise TypeError(
                f"gauge rule {common!r} ({rule!r}) does not declare the series it reads (use @reads or first())"
            )
        out[common] = tuple(names)
    return out


def map_metrics(samples: list[Sample], rules: Mapping[str, Rule]) -> dict[str, float]:
    """Apply an engine's rules in order; later rules may derive from earlier outputs."""
    out: dict[str, float] = {}
    for common, rule in rules.items():
        v = rule(samples, out)
        if v is not None:
            out[common] = float(v)
    return out


#: vLLM's info gauge of its CacheConfig, and the labels the pool rule and the smoke test read from it.
VLLM_CACHE_INFO = "vllm:cache_config_info"
VLLM_CACHE_INFO_LABELS = ("block_size", "num_gpu_blocks", "enable_prefix_caching")


# ------------------------------------------------------------------------------------------
# vLLM (V1): usage is a fraction of blocks held by requests; the pool size comes from the labels
# of cache_config_info; cached-but-free blocks are not exported, so kv_evictable_tokens is absent.
# ------------------------------------------------------------------------------------------
@reads(VLLM_CACHE_INFO, labels=VLLM_CACHE_INFO_LABELS)
def _vllm_pool(samples: list[Sample], _out: dict[str, float]) -> float | None:
    total = 0.0
    found = False
    for s in samples:
        if s.name == VLLM_CACHE_INFO:
            try:
                total += int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"])
                found = True
            except (KeyError, ValueError):
                continue
    return total if found else None


@derived
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
@reads("sglang:kv_used_tokens")
def _sglang_used(samples: list[Sample], out: dict[str, float]) -> float | None:
    v = series(samples, "sglang:kv_used_tokens")
    if v is not None:
        return v
    if "kv_usage_frac" in out and "pool_tokens" in out:
        return round(out["kv_usage_frac"] * out["pool_tokens"])
    return None


@reads("sglang:cached_tokens_total")
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


@reads("sglang:num_retracted_requests_total", "sglang:num_retracted_reqs")
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
