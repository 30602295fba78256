"""Radix prefix cache (SGLang flavour): match, insert, split, lock, LRU eviction of leaves."""

import numpy as np
import pytest

from harness.refengine.radix import RadixCache


def ids(*xs: int) -> bytes:
    return np.asarray(xs, dtype=np.int32).tobytes()


def rng_ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 32000, n, dtype=np.int32)


def test_empty_tree_matches_nothing():
    t = RadixCache()
    n, node = t.match(ids(1, 2, 3), 2)
    assert n == 0 and node is t.root


def test_insert_then_match_respects_limit():
    t = RadixCache()
    a = rng_ids(100, 0)
    assert t.insert(a.tobytes())[0] == 100
    assert t.total == 100 and t.evictable == 100
    assert t.match(a.tobytes(), 99)[0] == 99  # the engine passes len - 1
    longer = np.concatenate((a, rng_ids(50, 1)))
    assert t.match(longer.tobytes(), 149)[0] == 100


def test_duplicate_insert_adds_nothing_and_divergence_splits():
    t = RadixCache()
    a = rng_ids(100, 0)
    t.insert(a.tobytes())
    assert t.insert(a.tobytes())[0] == 0
    b = a.copy()
    b[60:] = rng_ids(40, 2)
    assert t.insert(b.tobytes())[0] == 40  # shares 60 tokens
    assert t.total == 140
    assert sorted(len(x.key) // 4 for x in t.leaves()) == [40, 40]
    assert t.match(b.tobytes(), 99)[0] == 99


def test_partial_match_splits_edge():
    t = RadixCache()
    a = rng_ids(100, 0)
    t.insert(a.tobytes())
    q = np.concatenate((a[:30], rng_ids(10, 5)))
    n, node = t.match(q.tobytes(), 39)
    assert n == 30 and node.n == 30
    assert [c.n for c in node.children.values()] == [70]


def test_lock_protects_path_and_eviction_is_lru_over_leaves():
    t = RadixCache()
    a, b, c = rng_ids(50, 0), rng_ids(60, 1), rng_ids(70, 2)
    for x in (a, b, c):
        t.insert(x.tobytes())
    t.match(np.append(a, np.int32(7)).tobytes(), 50)  # a is now the most recently used
    _, nb = t.match(np.append(b, np.int32(7)).tobytes(), 60)
    t.lock(nb)  # b is running
    assert t.evictable == 50 + 70
    assert t.evict(1) == 70  # c: least recently used, unlocked
    assert t.evict(1) == 50  # then a; b stays locked
    assert t.evict(1) == 0
    t.unlock(nb)
    assert t.evict(1) == 60 and t.total == 0


def test_parent_becomes_leaf_and_goes_after_its_children():
    t = RadixCache()
    base = rng_ids(40, 0)
    turn1 = base
    turn2 = np.concatenate((base, rng_ids(30, 1)))
    other = rng_ids(25, 9)
    t.insert(turn1.tobytes())
    t.insert(turn2.tobytes())  # chain: [40] -> [30]
    t.insert(other.tobytes())  # most recent
    assert t.evict(1) == 30  # the session's leaf first
    assert t.evict(1) == 40  # then its parent, now a leaf with an older stamp than `other`
    assert t.evict(1) == 25


def test_paged_match_and_insert_are_page_aligned():
    t = RadixCache(page_size=16)
    a = rng_ids(100, 0)
    assert t.insert(a.tobytes())[0] == 96
    assert t.match(a.tobytes(), 99)[0] == 96
    assert t.match(a.tobytes(), 95)[0] == 80


def test_unlock_below_zero_is_a_bug():
    t = RadixCache()
    _, node = t.insert(rng_ids(10, 0).tobytes())
    with pytest.raises(AssertionError):
        t.unlock(node)
