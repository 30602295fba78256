"""Servers: how the harness reaches a serving engine.

Adapters for SGLang, vLLM and our HTTP emulator behind one interface (base.py); launching them,
Stage 0 smoke and the canary (smoke.py); Prometheus gauges mapped to common names (metrics.py); and
the tiny local model the CPU engines serve in tests (tiny_model.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from harness.servers.base import (
    EngineAdapter,
    EngineStartError,
    FlushError,
    ParsedTurn,
    ResponseError,
    ServerHandle,
    free_port,
    port_in_use,
)

if TYPE_CHECKING:
    from harness.config import CellConfig

ENGINE_NAMES = ("sglang", "vllm", "emulator")

__all__ = [
    "ENGINE_NAMES",
    "EngineAdapter",
    "EngineStartError",
    "FlushError",
    "ParsedTurn",
    "ResponseError",
    "ServerHandle",
    "free_port",
    "get_adapter",
    "port_in_use",
]


def get_adapter(
    name: str,
    *,
    cell: CellConfig | None = None,
    flavor: str | None = None,
    time_scale: float = 1.0,
    cell_ref: str | None = None,
    server_cmd: Sequence[str] | None = None,
) -> EngineAdapter:
    """The adapter for `name`: 'sglang', 'vllm', 'emulator' (flavor from `flavor`, else the
    cell's engine, else sglang) or 'emulator:sglang' / 'emulator:vllm'.

    With `cell`, block_size is the cell's page size from the start (before launch_command),
    which is what a client pointed at an already running server needs.
    """
    from harness.servers.emulator import EmulatorAdapter
    from harness.servers.sglang import SGLangAdapter
    from harness.servers.vllm import VLLMAdapter

    base, _, suffix = name.partition(":")
    block = cell.page_size if cell is not None else None
    if base == "sglang":
        return SGLangAdapter(server_cmd=server_cmd, block_size=block)
    if base == "vllm":
        return VLLMAdapter(server_cmd=server_cmd, block_size=block)
    if base == "emulator":
        fl = suffix or flavor or (cell.engine.name if cell is not None else "sglang")
        return EmulatorAdapter(fl, time_scale=time_scale, cell_ref=cell_ref, server_cmd=server_cmd, block_size=block)  # type: ignore[arg-type]
    raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINE_NAMES)} (or emulator:sglang|vllm)")
