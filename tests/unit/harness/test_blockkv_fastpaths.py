"""BlockKV's fast paths against their direct forms, over randomized request lifecycles.

- a request's block array at release is built from its admitted hit array and the blocks
  allocated since (BlockKV._block_array), not from its whole block list;
- a prefill chunk's new blocks are hashed from the array the pool hands them out as
  (BlockKV.alloc with BlockPool.allocate_array), not through `_cache_full`'s list slices;
- prefix sums are running sums read at each block's end (PrefixHasher.raw_sums), not block sums
  summed again, and mixed in place (PrefixHasher.mix): keys checked against Python integers.

Two BlockKVs play the same operations (admissions with shared prefixes, prefill chunks, decode
tokens, preemptions, finishes in random order), one as the code is and one with the direct forms
swapped in; every request's blocks and every view of the pool agree after every operation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.refengine.blocks import BlockPool, PrefixHasher
from harness.refengine.kv import BlockKV
from harness.refengine.request import EngineRequest, Req

B = 16


def _direct_alloc(self: BlockKV, req: Req, n: int) -> bool:
    """BlockKV.alloc as it was: blocks as a list, hashed through _cache_full."""
    need = self._new_blocks(req, req.done + n)
    if need > self.pool.free_count():
        return False
    if need:
        req.blocks.extend(self.pool.allocate(need))
    self._cache_full(req, req.done + n)
    return True


def _direct_block_array(req: Req) -> np.ndarray:
    return np.asarray(req.blocks, dtype=np.int64)


def _views(kv: BlockKV) -> tuple[Any, ...]:
    p = kv.pool
    return (p.free, p.ref, p.hash, p.cached, p.dups, p.free_cached, p.n_hashed, p.free_count())


def _play(kv: BlockKV, seed: int, check: Any) -> list[tuple[Any, ...]]:
    """A random mix of admissions, chunks, decode tokens, preemptions and finishes on `kv`, as
    vllm.py drives it; the state after each operation."""
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 32000, 3000).astype(np.int32) for _ in range(4)]
    running: list[Req] = []
    waiting: list[Req] = []
    states: list[tuple[Any, ...]] = []
    rid = 0
    for _ in range(400):
        op = int(rng.integers(0, 6))
        if op == 0 or not (running or waiting):
            rid += 1
            base = bases[int(rng.integers(len(bases)))]
            head = int(rng.integers(1, 1500))
            tail = rng.integers(0, 32000, int(rng.integers(0, 400))).astype(np.int32)
            prompt = np.concatenate((base[:head], tail))
            waiting.append(Req(EngineRequest(rid, prompt, int(rng.integers(1, 120))), 0.0, rid, 0))
        elif op == 1 and waiting:  # admission with its first chunk (vllm.py: _admit)
            req = waiting[0]
            prefix = kv.match(req, True)
            chunk = min(req.target - prefix, int(rng.integers(1, 800)))
            if chunk > 0 and kv.can_admit(req, prefix, chunk):
                waiting.pop(0)
                kv.admit(req, prefix)
                req.done = prefix  # (BaseEngine._start_prefill)
                assert kv.alloc(req, chunk)
                req.done = prefix + chunk
                req.state = "prefill"
                running.append(req)
        elif op == 2 and running:  # the next chunk of a prefill, or decode tokens
            req = running[int(rng.integers(len(running)))]
            if req.state == "prefill":
                x = min(req.target - req.done, int(rng.integers(1, 800)))
                if kv.alloc(req, x):
                    req.done += x
                    if req.done >= req.target:
                        req.state = "decode"
                        req.gen = max(req.gen, 1)
            else:
                for _t in range(int(rng.integers(1, 40))):
                    if req.gen >= req.max_tokens or not kv.grow_req(req, req.L + req.gen + 1):
                        break
                    req.gen += 1
        elif op == 3 and running:  # preemption: recomputed later from the queue's head
            req = running.pop(int(rng.integers(len(running))))
            computed = req.done if req.state == "prefill" else req.L + req.gen - 1
            kv.preempt(req, computed)
            req.target = req.L + req.gen if req.state == "decode" else req.L
            req.done = 0
            req.state = "waiting"
            waiting.insert(0, req)
        elif op >= 4 and running:
            done = [r for r in running if r.state == "decode" and r.gen >= r.max_tokens]
            if done:
                req = done[int(rng.integers(len(done)))]
                running.remove(req)
                kv.finish(req)
        for req in running:
            check(req)
        states.append((_views(kv), [(r.rid, list(r.blocks), r.ncached) for r in running]))
    return states


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("blocks", [120, 400])
def test_blockkv_fast_paths_are_the_direct_forms(seed: int, blocks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def block_array_is_the_list(req: Req) -> None:
        assert BlockKV._block_array(req).tolist() == req.blocks

    fast = _play(BlockKV(blocks * B, B, True), seed, block_array_is_the_list)
    with monkeypatch.context() as mp:
        mp.setattr(BlockKV, "alloc", _direct_alloc)
        mp.setattr(BlockKV, "_block_array", staticmethod(_direct_block_array))
        direct = _play(BlockKV(blocks * B, B, True), seed, lambda _r: None)
    assert len(fast) == len(direct)
    for i, (a, b) in enumerate(zip(fast, direct)):
        assert a == b, f"operation {i}"
    # the run exercised the fast paths: chunks of many blocks, and hits
    assert max(len(r) for _v, reqs in fast for _i, r, _n in reqs) > 4 * BlockPool.SMALL


def _direct_keys(tokens: np.ndarray, nblocks: int) -> list[int]:
    """Prefix keys by the definition, in Python integers: token j times multiplier j, summed mod
    2^64 up to each block's end, then splitmix64's finaliser."""
    mult = PrefixHasher(B)._multipliers(nblocks * B).tolist()
    out, s = [], 0
    for j in range(nblocks * B):
        s = (s + int(tokens[j]) * mult[j]) % 2**64
        if j % B == B - 1:
            z = s ^ (s >> 31)
            z = (z * 0xBF58476D1CE4E5B9) % 2**64
            z ^= z >> 29
            z = (z * 0x94D049BB133111EB) % 2**64
            out.append(z ^ (z >> 32))
    return out


def test_prefix_keys_are_the_running_sums_by_definition() -> None:
    rng = np.random.default_rng(7)
    h = PrefixHasher(B)
    for _ in range(30):
        a = rng.integers(0, 32000, int(rng.integers(16, 700))).astype(np.int32)
        b = rng.integers(0, 32000, int(rng.integers(0, 200))).astype(np.int32)
        nb = (len(a) + len(b)) // B
        assert h.key_array((a, b), nb).tolist() == _direct_keys(np.concatenate((a, b)), nb)
