"""Engine adapter contract: one interface for SGLang, vLLM and our emulator.

CONTRACT (fixed by the lead; the asyncio driver and the emulator are coded against these names —
extend, do not rename). The engines engineer fills in the implementations.
"""

from __future__ import annotations

import abc
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from harness.config import CellConfig


@dataclass(frozen=True)
class ServerHandle:
    base_url: str
    process: subprocess.Popen | None
    log_path: Path | None
    pid: int | None


@dataclass(frozen=True)
class ParsedTurn:
    output_ids: np.ndarray
    prompt_tokens: int | None
    cached_tokens: int
    completion_tokens: int | None


class ResponseError(Exception):
    """A response the client cannot use: recorded per turn with status 'error'."""

    def __init__(self, reason: str, http_status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.http_status = http_status


class FlushError(Exception):
    """The prefix cache could not be flushed or the flush did not empty it."""


class EngineAdapter(abc.ABC):
    name: str  # 'sglang' | 'vllm' | 'emulator'
    block_size: int  # hit granularity: 1 for SGLang pages, 16/32 for vLLM blocks

    @abc.abstractmethod
    def launch_command(
        self, cell: CellConfig, *, model: str, host: str, port: int, extra_args: Sequence[str] = ()
    ) -> tuple[list[str], dict[str, str]]:
        """argv and environment additions: every flag the cell implies."""

    @abc.abstractmethod
    def start(self, argv: list[str], env: dict[str, str], run_dir: Path, *, host: str, port: int, health_timeout: float) -> ServerHandle:
        """Start in its own process group, log to run_dir/server.log, wait for /health with a deadline.

        Clear errors for: port already in use, process exited early (with the log tail), never healthy.
        """

    @abc.abstractmethod
    def stop(self, handle: ServerHandle, *, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL after `grace` seconds."""

    @abc.abstractmethod
    def completion_request(self, prompt: np.ndarray, max_tokens: int, model_name: str) -> tuple[str, bytes]:
        """(path, JSON body) for /v1/completions: token-id prompt, greedy, ignore_eos, return_token_ids."""

    @abc.abstractmethod
    def parse_completion(self, http_status: int, body: bytes) -> ParsedTurn:
        """Output ids and usage; an absent cached-token field reads as 0. Raises ResponseError."""

    @abc.abstractmethod
    async def flush_cache(self, http: "aiohttp.ClientSession", base_url: str, *, timeout: float = 60.0) -> None:  # noqa: F821
        """Empty the prefix cache (SGLang /flush_cache?timeout=, retry on 400; vLLM /reset_prefix_cache,
        check the success body). Raises FlushError."""

    @abc.abstractmethod
    async def scrape_metrics(self, http: "aiohttp.ClientSession", base_url: str) -> dict[str, float]:  # noqa: F821
        """Parse /metrics (Prometheus text, via prometheus_client.parser) into common names:
        running, waiting, kv_used_tokens, kv_evictable_tokens, pool_tokens, kv_usage_frac,
        prompt_tokens_total, cached_tokens_total, generation_tokens_total, preemptions_total
        (names the engine lacks are absent)."""


def get_adapter(name: str, **kwargs: object) -> EngineAdapter:
    """The adapter for 'sglang', 'vllm' or 'emulator' (kwargs e.g. flavor='sglang'|'vllm' for the emulator)."""
    raise NotImplementedError("filled in by the engines implementation")
