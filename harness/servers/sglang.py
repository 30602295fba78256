"""SGLang (0.5.22) adapter.

Flags the harness cannot do without: --enable-cache-report (otherwise /v1/completions never
reports cached tokens) and --enable-metrics (otherwise /metrics has no sglang: series). The KV
pool is imposed with --max-total-tokens so Stage 0 can check it is exactly the cell's pool.
Eviction is pinned to LRU explicitly so a change of default cannot change the experiment.

Where it runs is the cell's business, not a special case here: `device` becomes --device (and
'cpu' also sets SGLANG_USE_CPU_ENGINE=1, without which SGLang 0.5.22's --device cpu takes a path
that needs vLLM's kernels), `mem_fraction_static` becomes --mem-fraction-static. A GPU cell
leaves both out and the argv is the one of record. docs/sglang-cpu.md has the measurements.

Requests go to the native POST /generate (input ids, sampling params), not /v1/completions: both
run the same tokenizer manager and scheduler (the same ids, the same cached count, checked on
0.5.22), but only /generate answers with `meta_info`, whose scheduler timings (with --enable-metrics:
queue_time, forward_entry_time = scheduled, prefill_finished_time = first token) and
request_finished_ts (last token, as the tokenizer received it) give each turn the engine's own
queue, first-token and decode times, as vLLM's per-request metrics do (the cost fit reads them).
The OpenAI endpoint reports no timing, streamed or not.

Length limits (0.5.22, tokenizer manager then scheduler): a prompt of n tokens with max_tokens m
is refused when n >= context, when n + m > context, and when n >= min(context - 1, pool - 1) - 5;
so the longest prompt a request can carry is min(context - m, min(context, pool) - 7).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from harness.servers.base import (
    EngineAdapter,
    FlushError,
    ParsedTurn,
    ResponseError,
    answer_object,
    as_int,
    is_id_list,
    with_launch_extras,
)
from harness.servers.metrics import SGLANG_RULES
from harness.servers.vllm import engine_python

if TYPE_CHECKING:
    import aiohttp

    from harness.config import CellConfig

SGLANG_MODULE = "sglang.launch_server"
FLUSH_PATH = "/flush_cache"
GENERATE_PATH = "/generate"
CPU_ENGINE_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
# The scheduler refuses n >= max_req_input_len = min(context - 1, pool - 1) - 5 (tp_worker.py).
INPUT_MARGIN = 5


def max_input_tokens(context_length: int, pool_tokens: int) -> int:
    """The scheduler's max_req_input_len: prompts of this many tokens or more are refused."""
    return min(context_length - 1, pool_tokens - 1) - INPUT_MARGIN


class SGLangAdapter(EngineAdapter):
    name = "sglang"
    block_size = 1  # page size 1: hits are counted per token

    def launch_command(
        self,
        cell: CellConfig,
        *,
        model: str,
        host: str,
        port: int,
        extra_args: Sequence[str] = (),
    ) -> tuple[list[str], dict[str, str]]:
        self.block_size = cell.page_size
        prefix = self.server_cmd or [engine_python("AGENTLOAD_SGLANG_PYTHON"), "-m", SGLANG_MODULE]
        argv = [
            *prefix,
            "--model-path",
            model,
            "--served-model-name",
            self.served_model_name(cell),
            "--host",
            host,
            "--port",
            str(port),
            "--max-total-tokens",
            str(cell.kv_pool_tokens),
            "--context-length",
            str(cell.context_length),
            "--page-size",
            str(cell.page_size),
            "--schedule-policy",
            cell.schedule_policy,
            "--chunked-prefill-size",
            str(cell.chunked_prefill),
            "--max-running-requests",
            str(cell.max_running),
            "--radix-eviction-policy",
            "lru",
            "--enable-cache-report",
            "--enable-metrics",
        ]
        if not cell.prefix_cache:
            argv.append("--disable-radix-cache")
        if cell.attention_backend:
            argv += ["--attention-backend", cell.attention_backend]
        if cell.device:
            argv += ["--device", cell.device]
        if cell.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", f"{cell.mem_fraction_static:g}"]
        if cell.model_revision and model == cell.model:  # a hub id: pin the weights' revision
            argv += ["--revision", cell.model_revision]
        argv = with_launch_extras(cell, argv, argv[len(prefix) :])  # the host kind's, then the command's
        argv.extend(extra_args)
        argv = self.under_cpu_quota(cell, argv, port)
        return argv, dict(CPU_ENGINE_ENV) if cell.device == "cpu" else {}

    # -- requests -------------------------------------------------------------------------
    def completion_request(self, prompt: np.ndarray, max_tokens: int, model_name: str) -> tuple[str, bytes]:
        """The turn as /generate takes it: greedy, exactly max_tokens (ignore_eos), over token ids
        (the served model is the only one; /generate takes no model name)."""
        body = {
            "input_ids": np.asarray(prompt).astype(np.int64, copy=False).tolist(),
            "sampling_params": {"max_new_tokens": int(max_tokens), "temperature": 0.0, "ignore_eos": True},
        }
        return GENERATE_PATH, orjson.dumps(body)

    def parse_completion(self, http_status: int, body: bytes) -> ParsedTurn:
        """/generate's answer: `output_ids` and `meta_info` (prompt, completion and cached tokens,
        the finish reason, and the timings `sglang_timings` reads)."""
        data = answer_object(http_status, body)
        ids = data.get("output_ids")
        if not is_id_list(ids):
            raise ResponseError("output_ids is missing or not a list of integers", http_status)
        meta = data.get("meta_info")
        if not isinstance(meta, dict):
            raise ResponseError("missing meta_info", http_status)
        if meta.get("prompt_tokens") is None:
            raise ResponseError("missing meta_info.prompt_tokens", http_status)
        prompt_tokens = as_int(meta["prompt_tokens"], "meta_info.prompt_tokens", http_status)
        completion = meta.get("completion_tokens")
        completion_tokens = (
            None if completion is None else as_int(completion, "meta_info.completion_tokens", http_status)
        )
        cached = meta.get("cached_tokens")
        cached_tokens = 0 if cached is None else as_int(cached, "meta_info.cached_tokens", http_status)
        extra: dict[str, Any] = {}
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") is not None:
            extra["finish_reason"] = finish["type"]
        extra.update(sglang_timings(meta))
        return ParsedTurn(
            output_ids=np.asarray(ids, dtype=np.int32),
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
            extra=extra,
        )

    def max_prompt_tokens(self, cell: CellConfig, max_tokens: int) -> int:
        """min(context - max_tokens, min(context, pool) - 7): see the module docstring."""
        return min(cell.context_length - max_tokens, max_input_tokens(cell.context_length, cell.kv_pool_tokens) - 1)

    async def flush_cache(self, http: aiohttp.ClientSession, base_url: str, *, timeout: float = 60.0) -> None:
        """POST /flush_cache?timeout=S, retrying on 400 (SGLang refuses while anything runs or waits).

        The server waits for idle up to S itself; the loop covers releases without that
        parameter (they refuse at once) and requests that arrive between two attempts.
        """
        import aiohttp

        deadline = time.monotonic() + timeout
        last = ""
        while True:
            left = max(1.0, deadline - time.monotonic())
            wait = min(30.0, left)
            try:
                async with http.post(
                    f"{base_url}{FLUSH_PATH}?timeout={wait:g}",
                    timeout=aiohttp.ClientTimeout(total=wait + 30.0),
                ) as resp:
                    status, body = resp.status, await resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                status, body = None, repr(exc).encode()
            if status == 200:
                return
            if status == 404:
                raise FlushError(f"{base_url}{FLUSH_PATH} not found: is this an SGLang server?")
            last = f"{status} {body[:200]!r}"
            if time.monotonic() >= deadline:
                raise FlushError(f"SGLang refused to flush its cache within {timeout:.0f} s (last answer: {last})")
            await asyncio.sleep(0.5)

    metric_map = SGLANG_RULES

    def expected_settings(self, cell: CellConfig) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_total_num_tokens": cell.kv_pool_tokens,
            "page_size": cell.page_size,
            "schedule_policy": cell.schedule_policy,
            "chunked_prefill_size": cell.chunked_prefill,
            "max_running_requests": cell.max_running,
            "disable_radix_cache": not cell.prefix_cache,
            "enable_cache_report": True,
            "enable_metrics": True,
            "context_length": cell.context_length,
            "radix_eviction_policy": "lru",
        }
        if cell.device:
            out["device"] = cell.device
        if cell.mem_fraction_static is not None:
            out["mem_fraction_static"] = cell.mem_fraction_static
        return out

    async def server_settings(self, http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
        """From /server_info (older releases: /get_server_info): server args + scheduler info."""
        import aiohttp

        tmo = aiohttp.ClientTimeout(total=30.0)
        for path in ("/server_info", "/get_server_info"):
            try:
                async with http.get(base_url + path, timeout=tmo) as resp:
                    if resp.status != 200:
                        continue
                    data = orjson.loads(await resp.read())
            except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError):
                continue
            if isinstance(data, dict):
                keys = self.expected_settings_keys
                return {k: data[k] for k in keys if k in data and data[k] is not None}
        return {}

    expected_settings_keys = (
        "max_total_num_tokens",
        "page_size",
        "schedule_policy",
        "chunked_prefill_size",
        "max_running_requests",
        "disable_radix_cache",
        "enable_cache_report",
        "enable_metrics",
        "context_length",
        "radix_eviction_policy",
        "device",
        "mem_fraction_static",
    )


def _seconds(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def sglang_timings(meta: dict[str, Any]) -> dict[str, float]:
    """The engine's own timings of one request, in seconds, in the fields vLLM's are recorded in:
    queue_time (meta_info.queue_time: seconds in the waiting queue), engine_ttft (scheduled ->
    first token: prefill_finished_time - forward_entry_time, the scheduler's epoch stamps) and
    engine_decode (first -> last token: request_finished_ts - prefill_finished_time; the last token
    as the tokenizer manager received it, a detokenizer hop after the scheduler). A value its
    stamps do not give (no --enable-metrics, an older release) is left out; a negative one too."""
    out: dict[str, float] = {}
    q = _seconds(meta.get("queue_time"))
    if q is not None and q >= 0:
        out["queue_time"] = q
    sched, first, last = (
        _seconds(meta.get(k)) for k in ("forward_entry_time", "prefill_finished_time", "request_finished_ts")
    )
    if sched is not None and first is not None and first >= sched > 0:
        out["engine_ttft"] = first - sched
    if first is not None and last is not None and last >= first > 0:
        out["engine_decode"] = last - first
    return out
