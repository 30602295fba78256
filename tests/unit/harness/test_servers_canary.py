"""The canary's pass threshold is the registered one: before the flush the repeat must reuse at least
1024 - block - 1 tokens, which a working cache (the whole prefix less the last token, in blocks) meets."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from harness.servers import ParsedTurn
from harness.servers.base import EngineAdapter
from harness.servers.smoke import canary, expected_cached

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------------------------------
# canary: the repeat before the flush must reuse the whole prompt less its last token, in blocks
# ---------------------------------------------------------------------------------------------
class _ScriptedAdapter(EngineAdapter):
    """Answers the canary's three requests with scripted cached-token counts."""

    name = "scripted"

    def __init__(self, cached: list[int], block_size: int) -> None:
        super().__init__(block_size=block_size)
        self.cached = list(cached)

    def launch_command(self, cell: Any, **kw: Any) -> Any:  # pragma: no cover - never launched
        raise NotImplementedError

    async def complete(
        self, http: Any, base_url: str, prompt: np.ndarray, max_tokens: int, model_name: str, *, timeout: float = 600.0
    ) -> ParsedTurn:
        return ParsedTurn(np.zeros(max_tokens, np.int32), len(prompt), self.cached.pop(0), max_tokens)

    async def flush_cache(self, http: Any, base_url: str, *, timeout: float = 60.0) -> None:
        return None


@pytest.mark.parametrize("bs", [1, 16, 32])
def test_canary_threshold_is_the_registered_one(bs: int) -> None:
    """Before the flush the repeat must reuse >= 1024 - block - 1 (the registered rule); a working
    cache reuses the whole prefix minus the last token (1023, 1008, 992), which passes."""
    full = expected_cached(1024, bs)
    floor = 1024 - bs - 1

    async def go(before: int) -> Any:
        return await canary(
            _ScriptedAdapter([0, before, 0], bs), "http://unused", model_name="m", http=object(), leave_empty=False
        )  # type: ignore[arg-type]

    ok = asyncio.run(go(full))
    assert ok.passed and ok.min_before == floor and full >= floor
    assert asyncio.run(go(floor)).passed
    short = asyncio.run(go(floor - 1))
    assert not short.passed and f"need >= {floor}" in short.reason
