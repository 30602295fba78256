"""A turn's ids are the fresh Philox stream of its key, whichever way the generator is built."""

from __future__ import annotations

import numpy as np

from harness.config import WorkloadConfig, load_config
from harness.workload.draws import _TOKEN_DOMAIN, STREAM_BASE, _generator, draw_session, turn_tokens


def test_turn_tokens_are_the_fresh_generators_draws() -> None:
    wl = load_config("workloads/standard", WorkloadConfig)
    for i in range(40):
        spec = draw_session(wl, 3, STREAM_BASE, i)
        for turn in range(1, spec.n_turns + 1):
            got = turn_tokens(wl, spec, turn)
            fresh = _generator(_TOKEN_DOMAIN, spec.token_seed & 0xFFFFFFFF, spec.token_seed >> 32, turn)
            n = wl.first_prompt if turn == 1 else wl.tool_tokens
            want = fresh.integers(wl.token_ids.low, wl.token_ids.high, size=n, dtype=np.int32)
            assert got.dtype == np.int32 and np.array_equal(got, want)
    # a draw in between (another generator on the same thread) changes nothing
    spec = draw_session(wl, 0, STREAM_BASE, 0)
    a = turn_tokens(wl, spec, 1)
    turn_tokens(wl, draw_session(wl, 0, STREAM_BASE, 1), 1)
    assert np.array_equal(turn_tokens(wl, spec, 1), a)
