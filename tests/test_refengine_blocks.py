"""Hashed block pool (vLLM flavour): whole-block hits, hashes kept until reallocation, LRU free queue."""

import numpy as np

from harness.refengine.blocks import BlockPool, PrefixHasher


def toks(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 32000, n, dtype=np.int32)


def test_prefix_keys_identify_prefixes():
    h = PrefixHasher(16)
    a = toks(64, 0)
    b = a.copy()
    b[40] += 1
    ka, kb = h.keys(a, 4), h.keys(b, 4)
    assert ka[:2] == kb[:2] and ka[2] != kb[2] and ka[3] != kb[3]
    assert h.keys(a[:32], 2) == ka[:2]
    assert len(set(ka)) == 4


def test_lookup_counts_whole_blocks_and_stops_at_first_miss():
    p = BlockPool(8, 16)
    a = toks(64, 0)
    keys = p.hasher.keys(a, 4)
    blocks = p.allocate(4)
    p.register(blocks[:2], keys[:2])
    p.release(blocks)
    assert p.lookup(keys, 4) == blocks[:2]
    assert p.lookup(keys, 1) == blocks[:1]
    assert p.free_cached == 2


def test_freed_blocks_keep_hash_until_reallocated_tail_first():
    p = BlockPool(4, 16)
    a = toks(64, 0)
    keys = p.hasher.keys(a, 4)
    blocks = p.allocate(4)
    p.register(blocks, keys)
    p.release(blocks)  # freed tail first: the last block is the first to be reused
    assert p.lookup(keys, 4) == blocks
    fresh = p.allocate(1)
    assert fresh == [blocks[3]]
    assert p.lookup(keys, 4) == blocks[:3]
    fresh += p.allocate(1)
    assert p.lookup(keys, 4) == blocks[:2]


def test_take_pulls_cached_blocks_out_of_the_free_queue():
    p = BlockPool(4, 16)
    keys = p.hasher.keys(toks(32, 1), 2)
    blocks = p.allocate(2)
    p.register(blocks, keys)
    p.release(blocks)
    hit = p.lookup(keys, 2)
    assert p.needed(hit, 1) == 3
    p.take(hit)
    assert p.free_count() == 2 and p.free_cached == 0
    assert p.allocate(2) and p.free_count() == 0
    assert p.lookup(keys, 2) == hit  # referenced blocks are never reallocated


def test_caching_off_registers_nothing():
    p = BlockPool(4, 16, caching=False)
    keys = p.hasher.keys(toks(32, 1), 2)
    blocks = p.allocate(2)
    p.register(blocks, keys)
    p.release(blocks)
    assert p.lookup(keys, 2) == [] and p.free_cached == 0
