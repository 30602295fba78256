"""What the sim2real unit tests build their runs from: a small closed-population vLLM cell with
given costs, and the E2 SGLang test cut to a 700 s protocol (so one simulated run takes about a
second), shared so that the cost-fit, replay and refusal tests speak of the same cell and test."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.config import CellConfig, TestBundle, load_test


def closed_cell(cost: dict[str, float], *, max_running: int, prefix_cache: bool, **overrides: Any) -> CellConfig:
    """A 131,072-token vLLM 0.32 cell of 32-token pages, mixed batches, an 8,192-token context."""
    base: dict[str, Any] = {
        "name": "t",
        "engine": {"name": "vllm", "version": "0.32.0"},
        "model": "m",
        "gpu": "g",
        "kv_pool_tokens": 131072,
        "page_size": 32,
        "chunked_prefill": 8192,
        "max_running": max_running,
        "prefix_cache": prefix_cache,
        "waiting_prefix_refresh": False,
        "batching": "mixed",
        "context_length": 8192,
        "cost": cost,
    }
    base.update(overrides)
    return CellConfig(**base)


def short_e2_bundle(rule_params: dict[str, float] | None = None) -> TestBundle:
    """configs/tests/e2-sglang-300k.yaml on a 700 s protocol (a burst of 20 at 200 s, the window
    [100, 700) s); `rule_params`, when given, replace the test's (e.g. spans cut to fit)."""
    bundle = load_test("configs/tests/e2-sglang-300k.yaml")
    short = bundle.protocol.model_copy(
        update={
            "duration": 700.0,
            "burst": bundle.protocol.burst.model_copy(update={"time": 200.0, "size": 20}),
            "window": bundle.protocol.window.model_copy(update={"start": 100.0, "end": 700.0}),
        }
    )
    if rule_params is None:
        return replace(bundle, protocol=short)
    return replace(bundle, protocol=short, test=bundle.test.model_copy(update={"rule_params": rule_params}))
