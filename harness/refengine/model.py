"""The reference engine model: a clock-free continuous-batching engine (paper SPEC §3, App. E.9, E.12),
built for a cell by one factory (Vidur's pattern: a base with the shared API, one class per engine).

- base.py    BaseEngine: submit / step(now, horizon) / complete / flush_cache / gauges, and what an
             iteration does to a request once planned (prefill done, decode stints, finishes)
- sglang.py  SGLangEngine: token radix KV, separate prefill and decode rounds (mixed chunks as an option)
- vllm.py    VLLMEngine: block KV, mixed batching, recompute preemption, fused decode-only steps

`EngineModel(cell, seed=...)` is the factory every caller uses; the cell's engine picks the class.
"""

from __future__ import annotations

from harness.config import CellConfig
from harness.refengine.base import BaseEngine
from harness.refengine.fused import plan_fused_decode
from harness.refengine.request import EngineCompletion, EngineRequest
from harness.refengine.sglang import SGLangEngine
from harness.refengine.vllm import VLLMEngine

__all__ = ["BaseEngine", "EngineCompletion", "EngineModel", "EngineRequest", "SGLangEngine", "VLLMEngine"]


def EngineModel(cell: CellConfig, *, seed: int = 0) -> BaseEngine:
    """The engine model of `cell`'s engine (SGLang or vLLM flavour), its outputs salted by `seed`.

    The vLLM flavour fuses decode-only steps with this module's `plan_fused_decode` (a test or
    benchmark that swaps it for a stub gets the stepped engine)."""
    name = cell.engine.name
    if name == "sglang":
        return SGLangEngine(cell, seed=seed)
    if name == "vllm":
        return VLLMEngine(cell, seed=seed, fuse=plan_fused_decode)
    raise ValueError(f"cell {cell.name!r}: engine {name!r} has no engine model; expected 'sglang' or 'vllm'")
