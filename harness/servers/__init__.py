"""Servers: how the harness reaches a serving engine.

Adapters for SGLang, vLLM and our HTTP emulator behind one interface (base.py); launching them,
Stage 0 smoke and the canary (smoke.py); Prometheus gauges mapped to common names (metrics.py); and
the tiny local model the CPU engines serve in tests (tiny_model.py).
"""

from __future__ import annotations

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
from harness.servers.registry import ENGINE_NAMES, get_adapter

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
