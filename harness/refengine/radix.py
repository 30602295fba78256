"""SGLang-flavour prefix cache: a radix tree over token ids with LRU eviction of unlocked leaves.

The rules the trap depends on, as SGLang 0.5.22 applies them (paper App. E.2, E.14):
- a match touches every node on its path (moves it to the recent end of the LRU order) and is
  split where it ends inside an edge, so a later eviction can free a suffix but keep the prefix;
- a running request locks its matched path (lock counts propagate to the root); a waiting request
  does not, so the prefix of a queued session stays evictable;
- eviction frees least-recently-used unlocked *leaves*; a parent whose last child went becomes a
  leaf itself and competes with its own stamp.

Edge labels are stored as `bytes` of little-endian int32 ids and prompts are compared with
`bytes.startswith(label, offset)`, a memcmp without copies. Children are keyed by the bytes of
their first page. LRU stamps are a logical counter, never a clock, so the order is deterministic.

Touches and locks are done per path segment, not node by node (a session's path grows by two
nodes a turn, and every turn looks it up, inserts into it and locks and unlocks it several times):

- a touch (one lookup or insert) takes one stamp and records it on the node where its path ends
  only: a node's LRU stamp is the newest stamp recorded in its subtree, which is what touching
  every node of each path gives, since a path is touched root first and in one go. Only leaves
  are ever compared (eviction takes unlocked leaves), and a leaf's subtree is itself plus the
  children it has lost: an evicted node hands its stamp to its parent. Two different leaves never
  carry one touch's stamp (one touch's nodes lie on one root path), so the eviction order is the
  order node-by-node ticks give (tests/test_refengine_fastpaths.py checks it against the direct
  form, tests/radix_reference.py, operation by operation);
- a node's `lock` is its own lock count plus the number of its children that are locked, so it
  is nonzero exactly when the path-propagated count would be; locking or unlocking a path walks
  only the nodes whose state changes (from the locked node up to the first ancestor already
  locked), not every node up to the root.
"""

from __future__ import annotations

import heapq

import numpy as np

_ITEM = 4  # bytes per token id (int32)


class Node:
    __slots__ = ("alive", "children", "depth", "key", "lock", "n", "nid", "parent", "spelt", "stamp")

    def __init__(self, key: bytes, parent: Node | None, nid: int) -> None:
        self.key = key
        self.n = len(key) // _ITEM
        # tokens the path from the root to here spells (a split keeps it: the lower part's end
        # does not move); bounds what locking the path can take from `evictable`
        self.depth: int = self.n if parent is None else parent.depth + self.n
        self.children: dict[bytes, Node] = {}
        self.parent = parent
        self.lock = 0  # requests locked here + children with a nonzero lock
        self.stamp = 0  # newest touch recorded here or handed up by an evicted child
        self.alive = True
        self.nid = nid
        # the ids the path from the root to here spells, as (prompt, outputs) of a request that
        # finished here (TokenKV's lookups from a session's last turn); dropped when evicted
        self.spelt: tuple[bytes, bytes] | None = None


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
    def _touch_path(self, node: Node) -> None:
        """Touch the path from the root to `node`: one stamp, recorded where the path ends."""
        if node is self.root:
            return
        self._tick += 1
        node.stamp = self._tick
        if node.lock == 0 and not node.children:
            heapq.heappush(self._heap, (node.stamp, node.nid, node))

    # -- match -----------------------------------------------------------------------------------
    def match(self, ids: bytes, limit: int, touch: bool = True) -> tuple[int, Node]:
        """Longest cached prefix of `ids` within its first `limit` tokens, page-aligned.

        Returns (tokens, last node). The caller passes limit = len(prompt) - 1 so at least one
        token is computed (the logits of the last prompt position produce the first output).
        """
        return self.match_from(self.root, 0, ids, limit, touch)

    def match_from(self, node: Node, depth: int, ids: bytes, limit: int, touch: bool = True) -> tuple[int, Node]:
        """`match(ids, limit, touch)` for a caller that knows live `node` ends at `depth` tokens on
        the path of `ids` (it spells ids[:depth]): the walk from the root would pass through it, so
        it starts there (from the root if `depth` is beyond the limit)."""
        limit_b = (limit // self.page) * self._pb
        pos = depth * _ITEM
        if pos > limit_b:
            node, pos = self.root, 0
        pb = self._pb
        while pos < limit_b:
            child = node.children.get(ids[pos : pos + pb])
            if child is None:
                break
            klen = len(child.key)
            if pos + klen <= limit_b and ids.startswith(child.key, pos):
                node = child
                pos += klen
                continue
            m = self._common(child.key, ids, pos, min(klen, limit_b - pos))
            if m > 0:
                node = self._split(child, m)
                pos += m
            break
        if touch:
            self._touch_path(node)
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
        """Cut `child`'s edge after mbytes: a new parent holds the prefix, `child` keeps the rest.
        The new node is locked if `child` is (it has one child, `child`) and its LRU stamp is
        child's, through its subtree."""
        parent = child.parent
        assert parent is not None
        head = Node(child.key[:mbytes], parent, self._new_id())
        head.lock = 1 if child.lock else 0
        parent.children[child.key[: self._pb]] = head
        child.key = child.key[mbytes:]
        child.n = len(child.key) // _ITEM
        child.parent = head
        head.children[child.key[: self._pb]] = child
        return head

    # -- locks -----------------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """A request was admitted on the path ending at `node`: protect it from eviction."""
        root = self.root
        start = node.depth
        while node is not root:
            node.lock += 1
            if node.lock > 1:
                break  # it was locked already, and so is every node above it
            node = node.parent  # type: ignore[assignment]
        self.evictable -= start - node.depth  # the tokens of the nodes below where the walk stopped

    def unlock(self, node: Node) -> None:
        """Only `node` itself can become an unlocked leaf: every node above it keeps the child the
        walk came from (a locked node is never evicted), so only it is queued for eviction."""
        root = self.root
        if node is root:
            return
        node.lock -= 1
        if node.lock > 0:
            return  # still locked (by another request, or through another child)
        if node.lock < 0:
            raise AssertionError("radix lock count below zero")
        if not node.children and node.alive:
            heapq.heappush(self._heap, (node.stamp, node.nid, node))
        start = node.depth
        node = node.parent  # type: ignore[assignment]
        while node is not root:
            node.lock -= 1
            if node.lock > 0:
                break  # still locked (by another request, or through another child)
            if node.lock < 0:
                raise AssertionError("radix lock count below zero")
            node = node.parent  # type: ignore[assignment]
        self.evictable += start - node.depth  # the tokens of the nodes below where the walk stopped

    def evictable_if_locked(self, node: Node) -> int:
        """`evictable` as it would be with the path ending at `node` locked, without locking it:
        the unlocked nodes of a path are the ones below its deepest locked node."""
        root = self.root
        start = node.depth
        while node is not root and node.lock == 0:
            node = node.parent  # type: ignore[assignment]
        return self.evictable - (start - node.depth)

    # -- insert ----------------------------------------------------------------------------------
    def insert(self, ids: bytes) -> tuple[int, Node]:
        """Insert the page-aligned part of `ids`; returns (tokens newly added, last node).

        Tokens already present are not added again; the caller frees its own copy of them.
        """
        return self.insert_from(self.root, 0, ids)

    def insert_from(
        self, node: Node, depth: int, ids: bytes, upto: int | None = None, offset: int = 0, lock: bool = False
    ) -> tuple[int, Node]:
        """`insert(seq[:upto])` for a caller that knows `node` ends at `depth` tokens on the path of
        the sequence `seq` (a request's own locked node): the walk starts there, without comparing
        the tokens above it again; the whole path is touched, as a walk from the root would.

        `ids` holds seq from token `offset` on (offset <= depth: the walk never reads before
        `depth`, so a caller passes the tail it has, without copying the rest); `upto` (tokens,
        default all of `ids`) is cut down to whole pages. `lock`: then lock the path, as
        `lock(last node)` after the insert would; the last node is locked before its touch, so it
        is not queued for eviction only to be found locked (unlocking it queues it again)."""
        if upto is None:
            upto = offset + len(ids) // _ITEM
        end = ((upto // self.page) * self.page - offset) * _ITEM
        pos = (depth - offset) * _ITEM
        pb = self._pb
        while pos < end:
            first = ids[pos : pos + pb]
            child = node.children.get(first)
            if child is None:
                self._nid += 1
                leaf = Node(ids[pos:end], node, self._nid)
                node.children[first] = leaf
                self.total += leaf.n
                self.evictable += leaf.n
                if lock:
                    self.lock(leaf)
                self._touch_path(leaf)
                return (end - pos) // _ITEM, leaf
            klen = len(child.key)
            if pos + klen <= end and ids.startswith(child.key, pos):
                node = child
                pos += klen
                continue
            m = self._common(child.key, ids, pos, min(klen, end - pos))
            node = self._split(child, m)
            pos += m
        if lock:
            self.lock(node)
        self._touch_path(node)
        return 0, node

    # -- evict -----------------------------------------------------------------------------------
    def evict(self, tokens: int) -> int:
        """Free at least `tokens` tokens from least-recently-used unlocked leaves (fewer if none)."""
        freed = 0
        heap = self._heap
        pop, push = heapq.heappop, heapq.heappush
        pb = self._pb
        root = self.root
        while freed < tokens and heap:
            stamp, _, node = pop(heap)
            if not node.alive or node.lock or node.children or node.stamp != stamp:
                continue  # stale entry: touched, locked, grown or gone since it was queued
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[:pb]]
            node.alive = False
            node.spelt = None
            if node.stamp > parent.stamp:
                parent.stamp = node.stamp  # the parent was touched with it, through this node
            freed += node.n
            # _maybe_leaf(parent), written out: queue the parent if it has just become an unlocked leaf
            if parent is not root and parent.lock == 0 and not parent.children and parent.alive:
                push(heap, (parent.stamp, parent.nid, parent))
        self.total -= freed
        self.evictable -= freed
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
