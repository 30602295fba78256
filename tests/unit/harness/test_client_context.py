"""The session machine's context buffer gives exactly the prompts the concatenating form gives.

SessionMachine writes each turn's new ids into one buffer and hands out views of it (speed only:
benchmarks/bench_sim.py); the direct form below concatenates the previous prompt, the server's ids
and the tool ids. Every prompt must match, and a prompt sent earlier must stay as it was after
later turns write to the buffer (the engine keeps the arrays it was sent)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.client.session import Phase, SessionMachine
from harness.config import WorkloadConfig
from harness.workload.draws import STREAM_CLOSED, draw_session, turn_tokens

WL = WorkloadConfig(name="tiny", first_prompt=40, tool_tokens=11, decode_tokens=5)


def _direct_prompts(spec, outputs: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    prompts = []
    prompt = np.empty(0, dtype=np.int32)
    for k in range(1, spec.n_turns + 1):
        new = turn_tokens(WL, spec, k)
        prompt = new if k == 1 else np.concatenate((prompt, new))
        prompts.append(prompt)
        if k < spec.n_turns:
            prompt = np.concatenate((prompt, np.asarray(outputs[k - 1], dtype=np.int32)))
    return prompts


@pytest.mark.parametrize("index", range(40))
def test_prompts_are_the_concatenated_context(index: int) -> None:
    spec = draw_session(WL, 3, STREAM_CLOSED, index)
    rng = np.random.default_rng(index)
    # the server's ids: decode_tokens a turn, or fewer, none, or many more (the buffer must grow)
    lengths = rng.choice([WL.decode_tokens, 0, 2, 3 * WL.decode_tokens, 400], size=spec.n_turns)
    outputs = [rng.integers(4, 32000, size=int(n), dtype=np.int64) for n in lengths]
    want = _direct_prompts(spec, outputs)
    m = SessionMachine(index, spec, WL)
    sent: list[np.ndarray] = []
    copies: list[np.ndarray] = []
    for k in range(1, spec.n_turns + 1):
        p = m.next_prompt()
        assert p.dtype == np.int32 and np.array_equal(p, want[k - 1]), k
        sent.append(p)
        copies.append(p.copy())
        outcome = m.on_output(outputs[k - 1] if k < spec.n_turns else np.arange(3, dtype=np.int32), True)
        assert outcome.done == (k == spec.n_turns)
    assert m.phase is Phase.DONE and m.prompt.size == 0
    for p, c in zip(sent, copies, strict=True):  # later turns never wrote over a prompt sent before
        assert np.array_equal(p, c)


def test_a_failed_turn_ends_the_session() -> None:
    spec = draw_session(WL, 0, STREAM_CLOSED, 1)
    m = SessionMachine(1, spec, WL)
    m.next_prompt()
    assert m.on_output(None, False).done and m.phase is Phase.FAILED
    with pytest.raises(RuntimeError):
        m.next_prompt()
