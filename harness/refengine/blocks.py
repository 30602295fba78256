"""vLLM-flavour KV: a pool of fixed-size blocks with hash-addressed prefix caching.

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
identifies tokens[:(i+1)*B]. This is a simulator stand-in for vLLM's chained SHA hashes. The
sums are exact modular arithmetic, so a sequence that starts with an earlier one continues from
that one's last sum (`raw_sums(start, base)`; BlockKV keys a session's next turn that way).

The pool keeps its per-block state in numpy arrays and works on a request's blocks a batch at a
time (a turn allocates, hashes and frees thousands of blocks in the trap, where every prompt is
recomputed). Two structures make that possible without changing a single outcome:

- the free queue is an array with lazy deletion: a block's entry is live while `_pos[block]`
  points at it, so taking a cached block out of the middle of the queue, vLLM's
  `remove`, marks nothing but the block; popping from the head skips dead entries;
- a hash is an *entry* `sid * num_blocks + block` (sid counts hashing events), valid while the
  block's `_stamp` is that entry. Reusing a block just clears its stamp; the key -> entry maps are
  resolved when they are read (the first valid entry in hashing order is the block a lookup
  finds, the rest are the duplicates), which is what vLLM's eager bookkeeping gives.

tests/support/blockpool_reference.py keeps the direct one-block-at-a-time formulation; a randomized test
checks that both give the same blocks, hits and gauges operation by operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import itemgetter

import numpy as np

_NO_ENTRIES = np.empty(0, dtype=np.int64)
#: tests on small bool arrays: count_nonzero(a) == a.size for a.all(), count_nonzero(a) for
#: a.any() (the methods' Python wrappers cost more than the test, on the arrays a turn makes)
_count = np.count_nonzero
# splitmix64's constants as 0-d arrays: a ufunc takes them as they are (a numpy scalar is made
# into an array at every call)
_MIX1 = np.array(0xBF58476D1CE4E5B9, dtype=np.uint64)
_MIX2 = np.array(0x94D049BB133111EB, dtype=np.uint64)
_S29, _S31, _S32 = (np.array(x, dtype=np.uint64) for x in (29, 31, 32))


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
        keys: list[int] = self.key_array((tokens,), nblocks).tolist()
        return keys

    def key_array(self, parts: Sequence[np.ndarray], nblocks: int) -> np.ndarray:
        """The prefix keys (uint64) of the first nblocks blocks of the concatenated `parts` (a
        request's prompt and outputs, read in place rather than joined first)."""
        return self.mix(self.raw_sums(parts, nblocks), copy=False)

    def raw_sums(self, parts: Sequence[np.ndarray], nblocks: int, start: int = 0, base: int = 0) -> np.ndarray:
        """The unmixed prefix sums of blocks start..nblocks-1 of the concatenated `parts`: block
        i's is `base` (block start-1's, 0 from the start) plus the folded tokens of blocks start..i,
        mod 2^64. The sums are exact modular arithmetic, so sums continued from an earlier
        sequence's `base` are the ones a pass from the first token gives (a session's next turn
        starts with its last turn's sequence, so only its new blocks need summing: BlockKV._keys)."""
        B = self.block
        lo, n = start * B, nblocks * B
        if n <= lo:
            return np.empty(0, dtype=np.uint64)
        mult = self._multipliers(n)
        v = np.empty(n - lo, dtype=np.uint64)
        pos = 0  # token position in the concatenation
        for part in parts:
            a, b = max(lo - pos, 0), min(len(part), n - pos)  # this part's tokens in [lo, n)
            if b > a:
                np.multiply(
                    part[a:b],
                    mult[pos + a : pos + b],
                    out=v[pos + a - lo : pos + b - lo],
                    dtype=np.uint64,
                    casting="unsafe",
                )
            pos += len(part)
            if pos >= n:
                break
        if pos < n:
            raise ValueError(f"{nblocks} blocks of {B} tokens asked of {pos} tokens")
        # running sums over the tokens, read at each block's last token: the block sums' running
        # sums (exact mod 2^64, in any grouping), without a sum per block first
        np.add.accumulate(v, out=v)  # (np.cumsum, less its wrapper: v is uint64)
        s: np.ndarray = v[B - 1 :: B] + np.uint64(base)  # a copy: the sums are kept, v is not
        return s

    @staticmethod
    def mix(raw: np.ndarray, copy: bool = True) -> np.ndarray:
        """Keys from raw prefix sums (splitmix64's finaliser; in place with copy=False)."""
        s = raw.copy() if copy else raw
        t = np.right_shift(s, _S31)  # one scratch array for the three shifts
        np.bitwise_xor(s, t, out=s)
        np.multiply(s, _MIX1, out=s)
        np.right_shift(s, _S29, out=t)
        np.bitwise_xor(s, t, out=s)
        np.multiply(s, _MIX2, out=s)
        np.right_shift(s, _S32, out=t)
        np.bitwise_xor(s, t, out=s)
        return s


class BlockPool:
    """Blocks 0..n-1 with ref counts, hashes and an LRU free queue (vLLM's BlockPool).

    Like vLLM's BlockHashToBlockMap, a key can map to several blocks: a block is hashed when it
    fills, without checking whether identical content is already cached (two requests computing
    the same prefix at once, or a fully cached prompt recomputing its last block). A lookup finds
    the first block hashed with the key that still carries it; the others are its duplicates
    (`cached` and `dups` show both views). A request's block list holds distinct blocks.
    """

    #: batches up to this size go block by block (numpy's per-call cost is larger below it)
    SMALL = 8
    #: the maps are pruned once they hold PRUNE_FACTOR x the pool's blocks (plus PRUNE_SLACK) keys,
    #: so a prune's cost is spread over many hashings
    PRUNE_FACTOR = 8
    PRUNE_SLACK = 1024

    def __init__(self, num_blocks: int, block: int, caching: bool = True) -> None:
        self.block = block
        self.num_blocks = num_blocks
        self.caching = caching
        self.hasher = PrefixHasher(block)
        self.reset()

    def reset(self) -> None:
        n = self.num_blocks
        self._ref = np.zeros(n, dtype=np.int64)
        self._stamp = np.full(n, -1, dtype=np.int64)  # the block's hash entry; -1: no hash
        self._key = np.zeros(n, dtype=np.uint64)  # the key of that entry (for the views)
        self._first = np.zeros(n, dtype=bool)  # the entry was its key's first when it was made
        self._sid = getattr(self, "_sid", 0)  # hashing events so far (never reset: an entry stays unique)
        self._map: dict[int, int] = {}  # key -> its first entry (possibly stale)
        self._dups: dict[int, list[int]] = {}  # key -> later entries, in hashing order (possibly stale)
        self._prune_at = self.PRUNE_FACTOR * n + self.PRUNE_SLACK
        # the free queue: buf[head:tail], an entry i live iff _pos[buf[i]] == i
        self._off = n + 32
        self._buf = np.zeros(4 * n + 64, dtype=np.int64)
        self._buf[self._off : self._off + n] = np.arange(n)
        self._pos = np.arange(self._off, self._off + n, dtype=np.int64)
        self._head, self._tail = self._off, self._off + n
        self._nfree = n
        self.free_cached = 0  # free blocks that still carry a hash (evictable cache)
        self.n_hashed = 0  # blocks carrying a hash (cached content, duplicates included)

    # -- the key -> block maps -----------------------------------------------------------------
    def _resolve(self, k: int) -> int:
        """The valid entry a lookup of k finds (-1: none), with k's maps tidied: the first valid
        entry in hashing order becomes k's first entry, the valid ones after it its duplicates."""
        n = self.num_blocks
        stamp = self._stamp
        entries: list[int] = [e for e in [self._map.get(k, -1), *self._dups.pop(k, ())] if e >= 0 and stamp[e % n] == e]
        if not entries:
            self._map.pop(k, None)
            return -1
        self._map[k] = entries[0]
        if len(entries) > 1:
            self._dups[k] = entries[1:]
        return entries[0]

    def _insert(self, k: int, e: int) -> None:
        """Entry e hashed with key k: the key's block if it has none, else a duplicate."""
        old = self._map.get(k, -1)
        if (old >= 0 and self._stamp[old % self.num_blocks] == old) or (k in self._dups and self._resolve(k) >= 0):
            self._dups.setdefault(k, []).append(e)
        else:
            self._map[k] = e

    def _prune(self) -> None:
        """Drop stale entries once the maps hold many (amortised: at least num_blocks hashings apart)."""
        n = self.num_blocks
        keys = list(self._map)
        ents = np.fromiter(self._map.values(), dtype=np.int64, count=len(keys))
        # the valid entries are a few of many (at most one a block): gather them by index, rather
        # than convert every entry and flag to Python and compress
        idx = np.flatnonzero(self._stamp[ents % n] == ents)
        kept: dict[int, int] = {}
        if idx.size == 1:
            kept[keys[int(idx[0])]] = int(ents[idx[0]])
        elif idx.size:
            kept = dict(zip(itemgetter(*idx.tolist())(keys), ents[idx].tolist()))
        for k in list(self._dups):
            if k in self._map and k not in kept:
                kept[k] = self._map[k]
        self._map = kept
        for k in list(self._dups):
            self._resolve(k)
        self._prune_at = max(2 * len(self._map), self.PRUNE_FACTOR * n) + self.PRUNE_SLACK

    # -- lookup ----------------------------------------------------------------------------------
    def lookup(self, keys: list[int], max_blocks: int) -> list[int]:
        """Blocks of the longest cached run of `keys`, at most max_blocks (no change to what is
        cached, free or referenced)."""
        blocks: list[int] = (self.lookup_entries(keys, max_blocks) % self.num_blocks).tolist()
        return blocks

    def lookup_entries(self, keys: list[int], max_blocks: int, known: np.ndarray | None = None) -> np.ndarray:
        """The hash entries of `lookup(keys, max_blocks)` (entry % num_blocks is the block).

        `known`: the entries an earlier lookup of the same keys returned (a waiting request is
        looked up at every step). Entries are never revalidated once stale (a block hashed again
        gets a new one), so each still valid is still the block its key finds; the lookup goes on
        from the first that is not. Otherwise the first keys are read one by one, then in growing
        batches: a miss usually comes first (the trap) or late (a session's whole history hits)."""
        if not self.caching:
            return _NO_ENTRIES
        mp = self._map
        stamp = self._stamp
        n = self.num_blocks
        m = min(max_blocks, len(keys))
        parts: list[np.ndarray] = []
        i = 0
        if known is not None and known.size:
            kn = known[:m]
            ok = stamp[kn % n] == kn
            i = kn.size if _count(ok) == kn.size else int(ok.argmin())
            if i:
                parts.append(kn[:i])
        if i == 0:
            few: list[int] = []
            while i < m and i < 4:  # in the trap the first key misses
                k = keys[i]
                e = mp.get(k)
                if e is None or (stamp[e % n] != e and (e := self._resolve(k)) < 0):
                    return np.array(few, dtype=np.int64) if few else _NO_ENTRIES
                few.append(e)
                i += 1
            if few:
                parts.append(np.array(few, dtype=np.int64))
        w = 32
        while i < m:
            if keys[i] not in mp:  # a miss right after the known blocks (new content): no batch
                break
            j = min(m, i + w)
            ents = np.fromiter(map(mp.get, keys[i:j], repeat(-1)), dtype=np.int64, count=j - i)
            ok = (ents >= 0) & (stamp[ents % n] == ents)
            if _count(ok) == ok.size:
                parts.append(ents)
                i, w = j, 4 * w
                continue
            bad = int(ok.argmin())  # the first key whose first entry is not its block now
            if bad:
                parts.append(ents[:bad])
            i += bad
            if ents[bad] < 0:
                break  # never hashed, or every block with it reused
            e = self._resolve(keys[i])  # a duplicate may still hold the content
            if e < 0:
                break
            parts.append(np.array([e], dtype=np.int64))
            i += 1
        if not parts:
            return _NO_ENTRIES
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def first_entries(self, blocks: Sequence[int] | np.ndarray) -> np.ndarray:
        """The entries of the leading `blocks` that carry their hash as their key's first entry:
        what a lookup of their keys finds while they stay cached (an entry is never valid again
        once stale, so a first entry stays the first valid one), usable as its `known` entries."""
        if len(blocks) == 0:
            return _NO_ENTRIES
        b = np.asarray(blocks, dtype=np.int64)
        st = self._stamp[b]
        ok = (st >= 0) & self._first[b]
        return st if _count(ok) == ok.size else st[: int(ok.argmin())]

    def free_count(self) -> int:
        return self._nfree

    def needed(self, hit: Sequence[int] | np.ndarray, new_blocks: int) -> int:
        """Free blocks an allocation would consume: the new ones plus hit blocks now in the queue."""
        if len(hit) == 0:
            return new_blocks
        return new_blocks + int(np.count_nonzero(self._ref[hit] == 0))

    # -- the free queue ----------------------------------------------------------------------------
    def _live(self, lo: int, hi: int) -> np.ndarray:
        seg = self._buf[lo:hi]
        live: np.ndarray = seg[self._pos[seg] == np.arange(lo, hi)]
        return live

    def _compact(self) -> None:
        live = self._live(self._head, self._tail)
        off = self._off
        self._buf[off : off + live.size] = live
        self._pos[live] = np.arange(off, off + live.size)
        self._head, self._tail = off, off + live.size

    def _append(self, blocks: np.ndarray) -> None:
        m = blocks.size
        if not m:
            return
        if self._tail + m > self._buf.size:
            self._compact()
        t = self._tail
        self._buf[t : t + m] = blocks
        self._pos[blocks] = np.arange(t, t + m)
        self._tail = t + m
        self._nfree += m

    def _prepend(self, blocks: np.ndarray) -> None:
        m = blocks.size
        if not m:
            return
        if self._head - m < 0:
            self._compact()
        h = self._head - m
        self._buf[h : h + m] = blocks
        self._pos[blocks] = np.arange(h, h + m)
        self._head = h
        self._nfree += m

    def _popleft(self, m: int) -> np.ndarray:
        """The first m live blocks of the queue, removed from it."""
        buf, pos, h, tail = self._buf, self._pos, self._head, self._tail
        w = m + 16
        while True:
            end = min(h + w, tail)
            seg = buf[h:end]
            idx = np.flatnonzero(pos[seg] == np.arange(h, end))
            if idx.size >= m or end == tail:
                break
            w = 2 * w
        idx = idx[:m]
        out = seg[idx]
        pos[out] = -1
        self._head = h + int(idx[-1]) + 1
        self._nfree -= m
        return out

    def peek_free(self, m: int) -> list[int]:
        """The first m blocks of the free queue (the next ones `allocate` takes), in order."""
        out: list[int] = []
        lo = self._head
        while len(out) < m and lo < self._tail:
            hi = min(self._tail, lo + max(2 * (m - len(out)), 64))
            out += self._live(lo, hi).tolist()
            lo = hi
        return out[:m]

    # -- allocation ------------------------------------------------------------------------------
    def take(self, hit: Sequence[int] | np.ndarray) -> None:
        """Reference cached blocks found by lookup (pulling free ones out of the queue)."""
        if len(hit) == 0:
            return
        h = np.asarray(hit, dtype=np.int64)
        ref = self._ref
        r = ref[h]  # one gather for the test and the increment (ref[h] += 1 gathers again)
        z = h[r == 0]
        if z.size:
            self._pos[z] = -1
            self._nfree -= z.size
            self.free_cached -= int(_count(self._stamp[z] >= 0))
        r += 1
        ref[h] = r

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks from the LRU end of the free queue; their old hashes are dropped."""
        if n > self._nfree:
            raise RuntimeError(f"block pool: {n} blocks requested, {self._nfree} free")
        if n <= 0:
            return []
        if n <= self.SMALL:  # a decode step's block: walk the queue head one entry at a time
            return self._allocate_few(n)
        blocks: list[int] = self.allocate_array(n).tolist()
        return blocks

    def allocate_array(self, n: int) -> np.ndarray:
        """`allocate(n)` as an int64 array, for n > SMALL (a prefill chunk's blocks: the caller
        hashes them from the array, BlockKV.alloc, rather than converting the list back)."""
        if not self.SMALL < n <= self._nfree:
            raise RuntimeError(f"block pool: {n} blocks requested as an array, {self._nfree} free")
        out = self._popleft(n)
        stamp = self._stamp
        had = out[stamp[out] >= 0]
        if had.size:
            stamp[had] = -1  # the content stays findable through a duplicate, if one is cached
            self.free_cached -= had.size
            self.n_hashed -= had.size
        self._ref[out] = 1
        return out

    def _allocate_few(self, n: int) -> list[int]:
        buf, pos, stamp, ref = self._buf, self._pos, self._stamp, self._ref
        h = self._head
        out: list[int] = []
        while len(out) < n:
            b = int(buf[h])
            if pos[b] == h:
                pos[b] = -1
                if stamp[b] >= 0:
                    stamp[b] = -1
                    self.free_cached -= 1
                    self.n_hashed -= 1
                ref[b] = 1
                out.append(b)
            h += 1
        self._head = h
        self._nfree -= n
        return out

    def _hash_block(self, blk: int, k: int) -> None:
        """Block blk, full, now carries key k (a block that already carries its hash is left as
        it is): one hashing event, and the key's block or a duplicate of it."""
        stamp = self._stamp
        if stamp[blk] >= 0:
            return
        n = self.num_blocks
        ent = self._sid * n + blk
        self._sid += 1
        stamp[blk] = ent
        self._key[blk] = k
        self.n_hashed += 1
        # _insert(k, ent), with the key's entry set at once when it has none (new content: one
        # dict operation; a key with duplicates on record always has an entry in _map)
        old = self._map.setdefault(k, ent)
        if old == ent:
            self._first[blk] = True
        elif stamp[old % n] == old or (k in self._dups and self._resolve(k) >= 0):
            self._dups.setdefault(k, []).append(ent)  # a duplicate: some earlier entry is valid
            self._first[blk] = False
        else:
            self._map[k] = ent
            self._first[blk] = True

    def register_one(self, blk: int, k: int) -> None:
        """`register([blk], [k])`: the block a decode token fills (most registrations of a healthy
        run), without the slices."""
        if not self.caching:
            return
        self._hash_block(blk, k)
        if len(self._map) > self._prune_at:
            self._prune()

    def register(self, blocks: list[int] | np.ndarray, keys: list[int], key_array: np.ndarray | None = None) -> None:
        """Make full blocks findable: blocks[i] holds the tokens keyed by keys[i] (blocks that
        already carry their hash are left as they are). `key_array`: the same keys as uint64, if
        the caller has them (they are stored for the views without converting the list).
        `blocks` may be an int64 array (BlockKV.alloc's new blocks: no conversion of a list)."""
        if not self.caching or len(blocks) == 0:
            return
        n = self.num_blocks
        stamp = self._stamp
        if len(blocks) <= self.SMALL:
            for blk, k in zip(blocks if isinstance(blocks, list) else blocks.tolist(), keys):
                self._hash_block(blk, k)
        else:
            m = min(len(blocks), len(keys))  # pairs, as zip makes them
            b = blocks[:m] if isinstance(blocks, np.ndarray) else np.fromiter(blocks, dtype=np.int64, count=m)
            fresh = stamp[b] < 0
            ks = list(keys[:m])
            karr = key_array[:m] if key_array is not None else None
            if _count(fresh) != m:
                ks = list(compress(ks, fresh.tolist()))
                b = b[fresh]
                karr = karr[fresh] if karr is not None else None
            m = b.size
            if not m:
                return
            e = (self._sid + np.arange(m, dtype=np.int64)) * n + b
            self._sid += m
            stamp[b] = e
            self._key[b] = karr if karr is not None else ks
            self.n_hashed += m
            mp = self._map
            el = e.tolist()
            # a key not in the maps gets its entry at once (setdefault: one dict operation for
            # new content); the others keep theirs for now and are read back
            old = np.fromiter(map(mp.setdefault, ks, el), dtype=np.int64, count=m)
            present = old != e
            live = present.copy()
            live[present] = stamp[old[present] % n] == old[present]  # the key's block still carries it
            if self._dups:  # a key with duplicates on record (always in _map too) is resolved one by one
                ind = self._dups.keys() & ks
                if ind:
                    live |= np.fromiter((k in ind for k in ks), dtype=bool, count=m)
            if _count(live):  # the key's block is cached: this block is a duplicate of it
                one = live.tolist()
                first = np.ones(m, dtype=bool)
                for i in compress(range(m), one):
                    self._insert(ks[i], el[i])
                    first[i] = mp.get(ks[i]) == el[i]
                stale = (present & ~live).tolist()
                mp.update(zip(compress(ks, stale), compress(el, stale)))
                self._first[b] = first
            else:  # new content, or content whose blocks were all reused: this block is its block
                if _count(present):
                    stale = present.tolist()
                    mp.update(zip(compress(ks, stale), compress(el, stale)))
                self._first[b] = True
        if len(self._map) > self._prune_at:
            self._prune()

    def release(self, blocks: Sequence[int] | np.ndarray) -> None:
        """Drop one reference to each block, tail first (vLLM's BlockPool.free_blocks).

        Freed blocks that carry a hash join the LRU end of the queue in that order, so a request's
        suffix is evicted before its prefix; freed blocks without a hash can never be hit and go
        to the *front*, in the same order, to be reused first (so they never push cached blocks
        out early). `blocks` may be an array (a caller that has one saves its conversion).
        """
        if len(blocks) == 0:
            return
        rb = np.asarray(blocks[::-1], dtype=np.int64)
        ref = self._ref
        left = ref[rb]  # ref[rb] -= 1 as its gather and scatter, keeping what it gathered
        left -= 1
        ref[rb] = left
        if _count(left < 0):
            raise AssertionError("block ref count below zero")
        z = rb[left == 0]
        if z.size:
            hashed = self._stamp[z] >= 0
            back = z[hashed]
            self._append(back)
            self.free_cached += back.size
            self._prepend(z[~hashed])

    # -- views (tests, the differential driver) -------------------------------------------------
    @property
    def free(self) -> list[int]:
        """The free queue in order, head (next allocated) first."""
        queue: list[int] = self._live(self._head, self._tail).tolist()
        return queue

    @property
    def ref(self) -> list[int]:
        return self._ref.tolist()

    def block_hash(self, b: int) -> int | None:
        """The key block b carries, None if it has none."""
        return int(self._key[b]) if self._stamp[b] >= 0 else None

    @property
    def hash(self) -> list[int | None]:
        return [self.block_hash(b) for b in range(self.num_blocks)]

    @property
    def cached(self) -> dict[int, int]:
        """key -> the block a lookup finds."""
        out = {}
        for k in list(self._map):
            e = self._resolve(k)
            if e >= 0:
                out[k] = e % self.num_blocks
        return out

    @property
    def dups(self) -> dict[int, list[int]]:
        """key -> the further blocks carrying it, in hashing order."""
        self.cached  # noqa: B018 - resolves every key
        return {k: [e % self.num_blocks for e in v] for k, v in self._dups.items()}

    # -- gauges ----------------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self._nfree
