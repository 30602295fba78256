"""Which adapter speaks to which engine: 'sglang', 'vllm', or our emulator in either dialect."""

from __future__ import annotations

from collections.abc import Sequence

from harness.config import CellConfig
from harness.servers.base import EngineAdapter
from harness.servers.emulator import EmulatorAdapter
from harness.servers.sglang import SGLangAdapter
from harness.servers.vllm import VLLMAdapter

ENGINE_NAMES = ("sglang", "vllm", "emulator")


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
