"""SGLang (0.5.22) adapter.

Flags the harness cannot do without: --enable-cache-report (otherwise /v1/completions never
reports cached tokens) and --enable-metrics (otherwise /metrics has no sglang: series). The KV
pool is imposed with --max-total-tokens so Stage 0 can check it is exactly the cell's pool.
Eviction is pinned to LRU explicitly so a change of default cannot change the experiment.

Where it runs is the cell's business, not a special case here: `device` becomes --device (and
'cpu' also sets SGLANG_USE_CPU_ENGINE=1, without which SGLang 0.5.22's --device cpu takes a path
that needs vLLM's kernels), `mem_fraction_static` becomes --mem-fraction-static. A GPU cell
leaves both out and the argv is the one of record. docs/sglang-cpu.md has the measurements.

Length limits (0.5.22, tokenizer manager then scheduler): a prompt of n tokens with max_tokens m
is refused when n >= context, when n + m > context, and when n >= min(context - 1, pool - 1) - 5;
so the longest prompt a request can carry is min(context - m, min(context, pool) - 7).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from harness.servers.base import EngineAdapter, FlushError, with_launch_extras
from harness.servers.metrics import SGLANG_RULES
from harness.servers.vllm import engine_python

if TYPE_CHECKING:
    import aiohttp

    from harness.config import CellConfig

SGLANG_MODULE = "sglang.launch_server"
FLUSH_PATH = "/flush_cache"
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
