"""Hashed block pool (vLLM flavour): whole-block hits, hashes kept until reallocation, LRU free queue."""

import numpy as np
import pytest

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


def _same(p: BlockPool, r) -> None:
    assert p.free == list(r.free)
    assert p.free_count() == r.free_count() and p.used_blocks == r.used_blocks
    assert p.free_cached == r.free_cached and p.n_hashed == r.n_hashed
    assert p.ref == r.ref and p.hash == r.hash
    assert p.cached == r.cached and p.dups == r.dups


@pytest.mark.parametrize(
    "num_blocks,keyspace,seed,slack",
    [
        (5, 8, 0, 1024),
        (40, 30, 1, 1024),
        (40, 5000, 2, 0),
        (300, 200, 3, 1024),
        (300, 4000, 4, 0),
        (64, 64, 5, 0),
        (16, 3000, 6, 0),
    ],
)
def test_pool_matches_the_reference_operation_by_operation(
    num_blocks: int, keyspace: int, seed: int, slack: int, monkeypatch
) -> None:
    """The batched pool against the direct one-block-at-a-time formulation
    (tests/support/blockpool_reference.py): requests allocate, hash (from a small key space, so content
    is recomputed and duplicated), look up, take hits and are freed, in random order; every
    return value and every view of the state agree after every operation, through queue
    compactions and map prunes."""
    from support.blockpool_reference import BlockPool as Reference

    monkeypatch.setattr(BlockPool, "PRUNE_SLACK", slack)  # 0: the maps are pruned often
    monkeypatch.setattr(BlockPool, "PRUNE_FACTOR", 2 if slack == 0 else 8)
    rng = np.random.default_rng(seed)
    p, r = BlockPool(num_blocks, 16), Reference(num_blocks, 16)
    q = BlockPool(num_blocks, 16)  # p's twin that hashes every batch at once (p: one block at a time, at random)
    reqs: list[list[int]] = []
    chains: list[list[int]] = []
    memo: dict[int, np.ndarray] = {}
    big = [int(x) * 2 + 1 for x in rng.integers(0, 2**63, keyspace, dtype=np.int64)]  # keys across the uint64 range
    for step in range(3000):
        op = rng.integers(0, 6)
        if op <= 1 and p.free_count():
            n = int(rng.integers(1, min(p.free_count(), 12 * BlockPool.SMALL) + 1))
            a, b = p.allocate(n), r.allocate(n)
            assert a == b == q.allocate(n)
            reqs.append(a)
        elif op == 2 and reqs:
            blocks = reqs[int(rng.integers(len(reqs)))]
            keys = [big[i] for i in rng.choice(keyspace, size=min(len(blocks), keyspace), replace=False)]
            if rng.random() < 0.5:
                p.register(blocks[: len(keys)], keys)
            else:  # block by block, as decode tokens fill them (BlockKV._cache_full)
                for blk, k in zip(blocks, keys):
                    p.register_one(blk, k)
            q.register(blocks[: len(keys)], keys)
            r.register(blocks[: len(keys)], keys)
            # the entries a returning session's lookup starts from, whichever way the blocks were hashed
            assert p.first_entries(blocks).tolist() == q.first_entries(blocks).tolist()
            chains.append(keys)
        elif op == 3:
            # distinct keys, as a prefix chain's are (a request's blocks are distinct blocks)
            keys = [big[i] for i in rng.choice(keyspace, size=min(int(rng.integers(1, 40)), keyspace), replace=False)]
            known = None
            if chains and rng.random() < 0.5:  # what was hashed before, as a returning session's prefix
                c = len(chains) - int(rng.integers(1, min(len(chains), 8) + 1))
                keys, known = chains[c], memo.get(c)
                ents = p.lookup_entries(keys, len(keys), known)  # a waiting request's lookup, step after step
                q.lookup_entries(keys, len(keys), known)
                memo[c] = ents
                assert (ents % num_blocks).tolist() == r.lookup(keys, len(keys))
            hit = p.lookup(keys, len(keys))
            assert hit == r.lookup(keys, len(keys)) == q.lookup(keys, len(keys))
            new = int(rng.integers(0, 4))
            assert p.needed(hit, new) == r.needed(hit, new)
            if hit and p.needed(hit, 0) <= p.free_count() and rng.random() < 0.7:
                p.take(hit)
                q.take(hit)
                r.take(hit)
                reqs.append(list(hit))
        elif op >= 4 and reqs:
            blocks = reqs.pop(int(rng.integers(len(reqs))))
            p.release(blocks)
            q.release(blocks)
            r.release(blocks)
        if step % 50 == 0:
            _same(p, r)
    _same(p, r)
    p.reset()
    r.reset()
    _same(p, r)
    for c, ents in memo.items():  # entries known before a flush find nothing after it
        assert (
            (p.lookup_entries(chains[c], len(chains[c]), ents) % num_blocks).tolist()
            == r.lookup(chains[c], len(chains[c]))
            == []
        )
