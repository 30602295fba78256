"""The engine model's factory: one class per engine flavour, built from the cell."""

from __future__ import annotations

import pytest
from test_refengine_model import cell

from harness.refengine.base import BaseEngine
from harness.refengine.kv import BlockKV, TokenKV
from harness.refengine.model import EngineModel, SGLangEngine, VLLMEngine


@pytest.mark.parametrize("engine, cls, kv", [("sglang", SGLangEngine, TokenKV), ("vllm", VLLMEngine, BlockKV)])
def test_the_cell_engine_picks_the_flavour(engine: str, cls: type, kv: type) -> None:
    e = EngineModel(cell(engine), seed=3)
    assert type(e) is cls and isinstance(e, BaseEngine) and isinstance(e.kv, kv) and e.seed == 3


def test_sglang_mixed_chunks_is_an_option_of_the_sglang_flavour() -> None:
    e = EngineModel(cell("sglang", batching="mixed"))
    assert type(e) is SGLangEngine and e.mixed_chunks  # type: ignore[attr-defined]
    assert not EngineModel(cell("sglang")).mixed_chunks  # type: ignore[attr-defined]


def test_a_vllm_cell_with_separate_batching_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"cell 'test-vllm': batching 'separate' on a vLLM cell; expected 'mixed'"):
        EngineModel(cell("vllm", batching="separate"))


def test_the_vllm_flavour_steps_one_at_a_time_without_a_fusion_planner() -> None:
    assert EngineModel(cell("vllm")).fuse is not None  # type: ignore[attr-defined]
    assert VLLMEngine(cell("vllm"), fuse=None).fuse is None
