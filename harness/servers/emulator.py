"""Adapter for our own HTTP emulator (`agentload emulator serve`).

The emulator speaks the SGLang or the vLLM dialect (its --flavor), so everything on the request
path is delegated to the real adapter of that flavor: a client that works against the emulator
then works against the engine with the same code, which is the point of having the emulator.
Only launching differs: `python -m harness.emulator serve` (the same command as `agentload
emulator serve`, without loading the CLI's other modules), run with the harness's interpreter.
A --server-cmd prefix replaces `python -m harness.emulator`.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import yaml

from harness.atomic import write_text_atomic
from harness.config import CellConfig, load_config
from harness.errors import ConfigError
from harness.servers.base import EngineAdapter, ParsedTurn
from harness.servers.sglang import SGLangAdapter
from harness.servers.vllm import VLLMAdapter

if TYPE_CHECKING:
    import aiohttp

    from harness.config import CellConfig

Flavor = Literal["sglang", "vllm"]


def cell_file(cell: CellConfig, ref: str | None = None) -> str:
    """An absolute path to a YAML file holding exactly `cell`, for the emulator's --cell.

    The emulator process resolves paths from its own working directory, and a test names its
    cell relative to the test file; so `ref` is used only when it is a file that loads to this
    very cell, otherwise the cell is written to a content-addressed file under the temp dir. Either
    way the emulator serves the cell the run validated and recorded.
    """
    if ref:
        path = Path(ref).expanduser()
        if path.is_file():
            try:
                if load_config(path, CellConfig) == cell:
                    return str(path.resolve())
            except ConfigError:
                pass
    data = cell.model_dump(mode="json")  # `cost` is inline, so `cost_file` need not resolve there
    text = yaml.safe_dump(data, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "agentload-cells"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{cell.name}-{digest}.yaml"
    if not out.exists():
        write_text_atomic(out, text)
    return str(out)


def _exact(x: float) -> str:
    """A float as text that parses back to the same float (the emulator's engine clock must run at
    exactly the driver's time scale; `:g` alone keeps only six significant digits)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


class EmulatorAdapter(EngineAdapter):
    name = "emulator"

    def __init__(
        self,
        flavor: Flavor = "sglang",
        *,
        time_scale: float = 1.0,
        cell_ref: str | None = None,
        server_cmd: Sequence[str] | None = None,
        block_size: int | None = None,
    ) -> None:
        if flavor not in ("sglang", "vllm"):
            raise ValueError(f"emulator flavor must be 'sglang' or 'vllm', got {flavor!r}")
        self.flavor: Flavor = flavor
        self.time_scale = float(time_scale)
        self.cell_ref = cell_ref
        self._dialect: EngineAdapter = SGLangAdapter() if flavor == "sglang" else VLLMAdapter()
        self.metric_map = self._dialect.metric_map  # the emulator exports its flavour's series
        super().__init__(
            server_cmd=server_cmd, block_size=block_size if block_size is not None else self._dialect.block_size
        )

    def launch_command(
        self,
        cell: CellConfig,
        *,
        model: str,
        host: str,
        port: int,
        extra_args: Sequence[str] = (),
    ) -> tuple[list[str], dict[str, str]]:
        """`model` is ignored: the emulator has no weights, only the cell's cost model; so are the
        cell's launch_extras, which are the real engine's arguments."""
        self.block_size = cell.page_size
        prefix = self.server_cmd or [sys.executable, "-m", "harness.emulator"]
        argv = [
            *prefix,
            "serve",
            "--cell",
            cell_file(cell, self.cell_ref),
            "--flavor",
            self.flavor,
            "--time-scale",
            _exact(self.time_scale),
            "--port",
            str(port),
        ]
        if host not in ("127.0.0.1", "localhost"):
            argv += ["--host", host]
        argv.extend(extra_args)
        return argv, {}

    def completion_request(self, prompt: np.ndarray, max_tokens: int, model_name: str) -> tuple[str, bytes]:
        return self._dialect.completion_request(prompt, max_tokens, model_name)

    def parse_completion(self, http_status: int, body: bytes) -> ParsedTurn:
        return self._dialect.parse_completion(http_status, body)

    async def flush_cache(self, http: aiohttp.ClientSession, base_url: str, *, timeout: float = 60.0) -> None:
        await self._dialect.flush_cache(http, base_url, timeout=timeout)

    def expected_settings(self, cell: CellConfig) -> dict[str, Any]:
        return self._dialect.expected_settings(cell)

    def max_prompt_tokens(self, cell: CellConfig, max_tokens: int) -> int:
        return self._dialect.max_prompt_tokens(cell, max_tokens)

    async def server_settings(self, http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
        return await self._dialect.server_settings(http, base_url)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "flavor": self.flavor, "time_scale": self.time_scale}
