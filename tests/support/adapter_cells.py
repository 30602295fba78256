"""A small test cell and an argv lookup, shared by the adapter tests that need no engine
(tests/unit/harness/test_servers_adapters.py, test_servers_sglang_0522.py)."""

from __future__ import annotations

from harness.config import CellConfig


def small_cell(**over: object) -> CellConfig:
    """A valid vLLM cell of test size; `over` replaces any field."""
    data: dict[str, object] = {
        "name": "t",
        "engine": {"name": "vllm", "version": "0.32.0"},
        "model": "tiny",
        "gpu": "cpu",
        "kv_pool_tokens": 32768,
        "page_size": 32,
        "context_length": 8192,
        "max_running": 16,
        "chunked_prefill": 4096,
    }
    data.update(over)
    return CellConfig.model_validate(data)


def flag(argv: list[str], name: str) -> str:
    """The value after `name` in a launch argv."""
    return argv[argv.index(name) + 1]
