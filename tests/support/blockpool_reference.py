"""The direct formulation of the vLLM-flavour block pool: the reference harness/refengine/blocks.py
is checked against (tests/unit/harness/test_refengine_blocks.py, operation by operation) and timed against
(benchmarks/bench_refengine.py). One block at a time, an OrderedDict free queue, eager hash
bookkeeping: slow in the trap, where every turn allocates, hashes and frees thousands of blocks,
but plain to read against vLLM's own BlockPool. It is the engine model's block pool as it was
before the batched one, unchanged.

vLLM-flavour KV: a pool of fixed-size blocks with hash-addressed prefix caching.

The rules that matter for the trap (vLLM V1, 0.32.0; paper App. E.2, E.14):
- only *full* blocks are cached, addressed by a hash of the block's tokens chained to its prefix,
  so cached counts are whole blocks;
- a lookup stops one token short of the prompt: a prompt whose every block is cached still
  recomputes its last block (so a 1024-token repeat reuses 1008 tokens at block size 16);
- a freed block keeps its hash and stays findable until it is reallocated; free blocks form an LRU
  queue (a request's blocks are freed tail first, so its suffix goes before its prefix), except
  that freed blocks holding no hash go to the front, to be reused first;
- allocation takes blocks from the head of the free queue and drops their hashes;
- a block is hashed as soon as it is full of scheduled tokens (vLLM caches blocks when it
  schedules them), so a running request's prefix is findable by others at once.

Prefix hashes are computed with numpy for a whole sequence at once: each block's tokens are
folded with per-position random multipliers (mod 2^64) and cumulatively summed, so key i
identifies tokens[:(i+1)*B]. This is a simulator stand-in for vLLM's chained SHA hashes.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


class PrefixHasher:
    """Prefix keys of full blocks; multipliers are fixed so keys are stable across runs."""

    def __init__(self, block: int) -> None:
        self.block = block
        self._mult = np.empty(0, dtype=np.uint64)

    def _multipliers(self, n: int) -> np.ndarray:
        if self._mult.size < n:
            size = max(n, 2 * self._mult.size, 65536)
            g = np.random.Generator(np.random.Philox(key=0x6B6579))
            self._mult = g.integers(0, 2**63, size=size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        return self._mult[:n]

    def keys(self, tokens: np.ndarray, nblocks: int) -> list[int]:
        n = nblocks * self.block
        if n == 0:
            return []
        v = tokens[:n].astype(np.uint64) * self._multipliers(n)
        s = np.cumsum(v.reshape(nblocks, self.block).sum(axis=1, dtype=np.uint64), dtype=np.uint64)
        s ^= s >> np.uint64(31)
        s *= _MIX1
        s ^= s >> np.uint64(29)
        s *= _MIX2
        s ^= s >> np.uint64(32)
        return s.tolist()


class BlockPool:
    """Blocks 0..n-1 with ref counts, hashes and an LRU free queue (vLLM's BlockPool).

    Like vLLM's BlockHashToBlockMap, a key can map to several blocks: a block is hashed when it
    fills, without checking whether identical content is already cached (two requests computing
    the same prefix at once, or a fully cached prompt recomputing its last block). `cached` holds
    the block a lookup returns (the first one hashed that is still cached) and `dups` the others in
    the order they were hashed.
    """

    def __init__(self, num_blocks: int, block: int, caching: bool = True) -> None:
        self.block = block
        self.num_blocks = num_blocks
        self.caching = caching
        self.hasher = PrefixHasher(block)
        self.reset()

    def reset(self) -> None:
        self.ref = [0] * self.num_blocks
        self.hash: list[int | None] = [None] * self.num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.num_blocks))
        self.cached: dict[int, int] = {}  # prefix key -> the block a lookup finds
        self.dups: dict[int, list[int]] = {}  # prefix key -> further blocks with that content
        self.free_cached = 0  # free blocks that still carry a hash (evictable cache)
        self.n_hashed = 0  # blocks carrying a hash (cached content, duplicates included)

    # -- lookup ----------------------------------------------------------------------------------
    def lookup(self, keys: list[int], max_blocks: int) -> list[int]:
        """Blocks of the longest cached run of `keys`, at most max_blocks (no side effects)."""
        out: list[int] = []
        if not self.caching:
            return out
        cached = self.cached
        for k in keys[:max_blocks]:
            b = cached.get(k)
            if b is None:
                break
            out.append(b)
        return out

    def free_count(self) -> int:
        return len(self.free)

    def needed(self, hit: list[int], new_blocks: int) -> int:
        """Free blocks an allocation would consume: the new ones plus hit blocks now in the queue."""
        ref = self.ref
        return new_blocks + sum(1 for b in hit if ref[b] == 0)

    # -- allocation ------------------------------------------------------------------------------
    def take(self, hit: list[int]) -> None:
        """Reference cached blocks found by lookup (pulling free ones out of the queue)."""
        ref = self.ref
        for b in hit:
            if ref[b] == 0:
                del self.free[b]
                if self.hash[b] is not None:
                    self.free_cached -= 1
            ref[b] += 1

    def _unhash(self, b: int, h: int) -> None:
        """Drop block b's hash (it is being reused): the content stays findable through a duplicate."""
        if self.cached.get(h) == b:
            more = self.dups.get(h)
            if more:
                self.cached[h] = more.pop(0)
                if not more:
                    del self.dups[h]
            else:
                del self.cached[h]
        else:
            more = self.dups.get(h)
            if more and b in more:
                more.remove(b)
                if not more:
                    del self.dups[h]
        self.hash[b] = None
        self.n_hashed -= 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks from the LRU end of the free queue; their old hashes are dropped."""
        if n > len(self.free):
            raise RuntimeError(f"block pool: {n} blocks requested, {len(self.free)} free")
        out: list[int] = []
        free = self.free
        for _ in range(n):
            b, _ = free.popitem(last=False)
            h = self.hash[b]
            if h is not None:
                self.free_cached -= 1
                self._unhash(b, h)
            self.ref[b] = 1
            out.append(b)
        return out

    def register(self, blocks: list[int], keys: list[int]) -> None:
        """Make full blocks findable: blocks[i] holds the tokens keyed by keys[i] (blocks that
        already carry their hash are left as they are)."""
        if not self.caching:
            return
        hashes = self.hash
        cached = self.cached
        for b, k in zip(blocks, keys):
            if hashes[b] is not None:
                continue
            hashes[b] = k
            self.n_hashed += 1
            if k not in cached:
                cached[k] = b
            else:
                self.dups.setdefault(k, []).append(b)

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block, tail first (vLLM's BlockPool.free_blocks).

        Freed blocks that carry a hash join the LRU end of the queue in that order, so a request's
        suffix is evicted before its prefix; freed blocks without a hash can never be hit and go
        to the *front*, in the same order, to be reused first (so they never push cached blocks
        out early).
        """
        ref = self.ref
        front: list[int] = []
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if self.hash[b] is not None:
                    self.free[b] = None
                    self.free_cached += 1
                else:
                    front.append(b)
            elif ref[b] < 0:
                raise AssertionError("block ref count below zero")
        free = self.free
        for b in reversed(front):
            free[b] = None
            free.move_to_end(b, last=False)

    # -- gauges ----------------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free)
