"""The direct formulation of the SGLang-flavour radix cache: the reference harness/refengine/radix.py
is checked against (tests/test_refengine_fastpaths.py, operation by operation) and timed against
(benchmarks/bench_refengine.py). Every lookup, insert, lock and unlock walks and touches its path
node by node, each touch taking the next tick of one logical clock; the fast form touches, locks
and unlocks per path segment and gives the same eviction order.

This is harness/refengine/radix.py as of commit 7201407, unchanged but for this docstring.
"""

from __future__ import annotations

import heapq

import numpy as np

_ITEM = 4  # bytes per token id (int32)


class Node:
    __slots__ = ("alive", "children", "key", "lock", "n", "nid", "parent", "stamp")

    def __init__(self, key: bytes, parent: Node | None, nid: int) -> None:
        self.key = key
        self.n = len(key) // _ITEM
        self.children: dict[bytes, Node] = {}
        self.parent = parent
        self.lock = 0
        self.stamp = 0
        self.alive = True
        self.nid = nid


class RadixCache:
    """Token-granular (page_size 1) or paged radix tree. Sizes are in tokens."""

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page = page_size
        self._pb = page_size * _ITEM  # bytes per page
        self.reset()

    def reset(self) -> None:
        """Drop every cached prefix (the engine checks that nothing is locked)."""
        self._nid = 0
        self._tick = 0
        self.root = Node(b"", None, self._new_id())
        self.root.lock = 1  # never evicted, never counted
        self.total = 0  # tokens held by the tree
        self.evictable = 0  # tokens in nodes with lock == 0
        self._heap: list[tuple[int, int, Node]] = []

    def _new_id(self) -> int:
        self._nid += 1
        return self._nid

    # -- LRU bookkeeping -------------------------------------------------------------------------
    def _touch(self, node: Node) -> None:
        self._tick += 1
        node.stamp = self._tick
        if node.lock == 0 and not node.children:
            heapq.heappush(self._heap, (node.stamp, node.nid, node))

    def _maybe_leaf(self, node: Node) -> None:
        """Queue `node` for eviction if it has just become an unlocked leaf."""
        if node is not self.root and node.lock == 0 and not node.children and node.alive:
            heapq.heappush(self._heap, (node.stamp, node.nid, node))

    # -- match -----------------------------------------------------------------------------------
    def match(self, ids: bytes, limit: int, touch: bool = True) -> tuple[int, Node]:
        """Longest cached prefix of `ids` within its first `limit` tokens, page-aligned.

        Returns (tokens, last node). The caller passes limit = len(prompt) - 1 so at least one
        token is computed (the logits of the last prompt position produce the first output).
        """
        limit_b = (limit // self.page) * self._pb
        node = self.root
        pos = 0
        pb = self._pb
        path: list[Node] = []
        while pos < limit_b:
            child = node.children.get(ids[pos : pos + pb])
            if child is None:
                break
            klen = len(child.key)
            if pos + klen <= limit_b and ids.startswith(child.key, pos):
                path.append(child)
                node = child
                pos += klen
                continue
            m = self._common(child.key, ids, pos, min(klen, limit_b - pos))
            if m > 0:
                node = self._split(child, m)
                path.append(node)
                pos += m
            break
        if touch:
            for nd in path:
                self._touch(nd)
        return pos // _ITEM, node

    def _common(self, key: bytes, ids: bytes, pos: int, nbytes: int) -> int:
        """Bytes of the page-aligned common prefix of key and ids[pos:], at most nbytes."""
        n = nbytes // _ITEM
        a = np.frombuffer(key, dtype=np.int32, count=n)
        b = np.frombuffer(ids, dtype=np.int32, count=n, offset=pos)
        diff = np.flatnonzero(a != b)
        m = int(diff[0]) if diff.size else n
        return (m // self.page) * self._pb

    def _split(self, child: Node, mbytes: int) -> Node:
        """Cut `child`'s edge after mbytes: a new parent holds the prefix, `child` keeps the rest."""
        parent = child.parent
        assert parent is not None
        head = Node(child.key[:mbytes], parent, self._new_id())
        head.lock = child.lock
        head.stamp = child.stamp
        parent.children[child.key[: self._pb]] = head
        child.key = child.key[mbytes:]
        child.n = len(child.key) // _ITEM
        child.parent = head
        head.children[child.key[: self._pb]] = child
        return head

    # -- locks -----------------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """A request was admitted on the path ending at `node`: protect it from eviction."""
        while node is not self.root:
            if node.lock == 0:
                self.evictable -= node.n
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.evictable += node.n
                self._maybe_leaf(node)
            elif node.lock < 0:
                raise AssertionError("radix lock count below zero")
            node = node.parent  # type: ignore[assignment]

    def evictable_if_locked(self, node: Node) -> int:
        """`evictable` as it would be with the path ending at `node` locked, without locking it:
        lock(node) followed by unlock(node) would give the same number but queue every leaf it
        touches for eviction again (harmless stale entries, but one per admission check)."""
        ev = self.evictable
        while node is not self.root:
            if node.lock == 0:
                ev -= node.n
            node = node.parent  # type: ignore[assignment]
        return ev

    # -- insert ----------------------------------------------------------------------------------
    def insert(self, ids: bytes) -> tuple[int, Node]:
        """Insert the page-aligned part of `ids`; returns (tokens newly added, last node).

        Tokens already present are not added again; the caller frees its own copy of them.
        """
        return self.insert_from(self.root, 0, ids)

    def insert_from(self, node: Node, depth: int, ids: bytes) -> tuple[int, Node]:
        """`insert(ids)` for a caller that knows `node` ends at `depth` tokens on the path of `ids`
        (a request's own locked node): the nodes above it are touched root first, as a walk from
        the root would, without comparing their tokens again."""
        end = (len(ids) // self._pb) * self._pb
        pos = depth * _ITEM
        pb = self._pb
        if node is not self.root:
            path = []
            nd: Node | None = node
            while nd is not None and nd is not self.root:
                path.append(nd)
                nd = nd.parent
            for nd in reversed(path):
                self._touch(nd)
        while pos < end:
            child = node.children.get(ids[pos : pos + pb])
            if child is None:
                leaf = Node(ids[pos:end], node, self._new_id())
                node.children[ids[pos : pos + pb]] = leaf
                self.total += leaf.n
                self.evictable += leaf.n
                self._touch(leaf)
                return (end - pos) // _ITEM, leaf
            klen = len(child.key)
            if pos + klen <= end and ids.startswith(child.key, pos):
                node = child
                pos += klen
                self._touch(node)
                continue
            m = self._common(child.key, ids, pos, min(klen, end - pos))
            node = self._split(child, m)
            pos += m
            self._touch(node)
        return 0, node

    # -- evict -----------------------------------------------------------------------------------
    def evict(self, tokens: int) -> int:
        """Free at least `tokens` tokens from least-recently-used unlocked leaves (fewer if none)."""
        freed = 0
        heap = self._heap
        while freed < tokens and heap:
            stamp, _, node = heapq.heappop(heap)
            if not node.alive or node.lock or node.children or node.stamp != stamp:
                continue  # stale entry: touched, locked, grown or gone since it was queued
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[: self._pb]]
            node.alive = False
            freed += node.n
            self.total -= node.n
            self.evictable -= node.n
            self._maybe_leaf(parent)
        return freed

    # -- introspection (tests, gauges) ---------------------------------------------------------
    @property
    def protected(self) -> int:
        return self.total - self.evictable

    def leaves(self) -> list[Node]:
        out: list[Node] = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            if nd.children:
                stack.extend(nd.children.values())
            elif nd is not self.root:
                out.append(nd)
        return out
