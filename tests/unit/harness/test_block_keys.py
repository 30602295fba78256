"""The vLLM flavour's block keys continued from a session's last turn equal the keys of a full pass.

BlockKV._keys reuses the prefix sums of a session's previous sequence when the new request's
leading bytes are that sequence, and sums only the blocks after it. Every key must be the one
PrefixHasher.key_array gives from the first token: the tests compare whole key arrays and lists,
over sessions that grow turn by turn, prompts that diverge from the last turn inside its blocks,
and prompts too short to hold it (where nothing may be reused)."""

from __future__ import annotations

import numpy as np

from harness.refengine.blocks import PrefixHasher
from harness.refengine.kv import BlockKV
from harness.refengine.request import EngineRequest, Req

B = 16


def _full(kv: BlockKV, req: Req) -> np.ndarray:
    return kv.pool.hasher.key_array((req.prompt, req.out), (req.L + req.max_tokens) // B)


def _req(ids: np.ndarray, max_tokens: int, rid: int) -> Req:
    return Req(EngineRequest(rid, ids.astype(np.int32), max_tokens), 0.0, rid, 0)


def test_raw_sums_continued_from_any_block_are_the_full_pass() -> None:
    h = PrefixHasher(B)
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 32000, int(rng.integers(1, 3000))).astype(np.int32)
        b = rng.integers(0, 32000, int(rng.integers(0, 500))).astype(np.int32)
        nb = (len(a) + len(b)) // B
        if nb == 0:
            continue
        raw = h.raw_sums((a, b), nb)
        assert np.array_equal(h.mix(raw), h.key_array((a, b), nb))
        st = int(rng.integers(0, nb + 1))
        part = h.raw_sums((a, b), nb, st, int(raw[st - 1]) if st else 0)
        assert np.array_equal(np.concatenate((raw[:st], part)), raw)


def test_a_sessions_keys_continue_from_its_last_turn_and_equal_a_full_pass() -> None:
    rng = np.random.default_rng(1)
    kv = BlockKV(1 << 20, B, True)
    rid = 0
    for _session in range(20):
        ids = rng.integers(0, 32000, int(rng.integers(20, 900))).astype(np.int32)
        for _turn in range(8):
            rid += 1
            req = _req(ids, int(rng.integers(1, 80)), rid)
            kv._keys(req, 0)
            want = _full(kv, req)
            assert np.array_equal(req.key_array, want) and req.keys == want.tolist()
            ids = np.concatenate(
                (req.prompt, req.out, rng.integers(0, 32000, int(rng.integers(1, 300))).astype(np.int32))
            )
    assert kv._seqs  # the sessions' sequences were kept, so the later turns took the continued path


def test_a_prompt_that_diverges_inside_the_last_turns_blocks_is_keyed_afresh() -> None:
    """One id changed inside the last turn's full blocks, in its prompt or in its outputs (the first
    16 ids kept, so the session's key finds the last turn): nothing may be reused. Each case
    starts from the same last turn in a fresh pool."""
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 32000, 700).astype(np.int32)
    tail = rng.integers(0, 32000, 50).astype(np.int32)
    for k, where in enumerate([40, 300, 699, 705, 735]):  # 700 prompt ids, 40 outputs, 46 full blocks
        kv = BlockKV(1 << 20, B, True)
        first = _req(prompt, 40, 1)
        kv._keys(first, 0)
        seq = np.concatenate((first.prompt, first.out))
        changed = seq.copy()
        changed[where] = (changed[where] + 1) % 32000
        req = _req(np.concatenate((changed, tail)), 10, 10 + k)
        kv._keys(req, 0)
        assert np.array_equal(req.key_array, _full(kv, req)), where
    kv = BlockKV(1 << 20, B, True)
    first = _req(prompt, 40, 1)
    kv._keys(first, 0)
    short = _req(np.concatenate((first.prompt, first.out))[:500], 5, 99)  # shorter than the last turn's sequence
    kv._keys(short, 0)
    assert np.array_equal(short.key_array, _full(kv, short))
