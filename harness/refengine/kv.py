"""KV memory of the two engine flavours: SGLang's token pool with its radix cache, vLLM's block pool.

TokenKV (SGLang): a pool of M token slots plus the radix cache. Admission (decided by the
scheduler, as SGLang's PrefillAdder does) is gated by free + evictable slots less what running
requests will still decode: in effect a running request reserves its prompt plus max_tokens from
admission to completion (paper App. E.9, S3-S4). Cached KV that no running request locks is
evictable and never blocks admission; it is evicted (LRU leaves) only when a running request needs
the physical slots.

BlockKV (vLLM): a pool of M/B blocks with hashed prefix caching. A waiting request is admitted only
if its whole sequence fits what is free right now (free blocks include cached ones, evicted on
reuse), but only the blocks of its first chunk are allocated; later chunks and decode tokens
allocate as they go, and a running request that cannot get a block forces a preemption.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, TypeVar

import numpy as np

from harness.refengine.blocks import BlockPool
from harness.refengine.radix import Node, RadixCache
from harness.refengine.request import Req

K = TypeVar("K")
V = TypeVar("V")


def _remember(memory: OrderedDict[K, V], key: K, value: V, bound: int) -> None:
    """Keep `value` as the most recent entry of a bounded per-session memory, dropping the least
    recent past `bound` (what a turn leaves for its session's next turn)."""
    memory[key] = value
    memory.move_to_end(key)
    if len(memory) > bound:
        memory.popitem(last=False)


HISTORY_KEY_BYTES = 64  # a session's first 16 ids key its finished turn's node (radix flavour)
HISTORY_SESSIONS = 2048  # finished requests whose cached entries are kept for their next turn


class TokenKV:
    """SGLang 0.5.22's token pool and radix cache, as the scheduler uses them.

    - a running request's prompt KV is put into the tree as soon as its prefill (or a prefill
      chunk) ends and stays locked there (checkpoint_kv_cache); its decode tokens are its own
      slots until it finishes, when prompt + outputs (less the last token, never computed) are
      inserted and unlocked (release_kv_cache), the outputs as a leaf under the prompt's node, so
      eviction drops a finished turn's outputs before its prompt;
    - content already in the tree is not stored twice: the request's duplicate slots are freed;
    - admission is decided by the scheduler against free + evictable slots (`free_and_evictable`,
      PrefillAdder's budget); physical slots are taken with LRU eviction of unlocked leaves.
    """

    def __init__(self, pool_tokens: int, page_size: int, caching: bool) -> None:
        self.M = pool_tokens
        self.page = page_size
        self.caching = caching
        self.tree = RadixCache(page_size)
        self.own = 0  # slots held by running requests outside the tree (uncheckpointed prefill + decode)
        # A finished request's last node, by its first ids (a session's turns all start with the
        # same ids); the node keeps the ids its path spells (Node.spelt: the request's prompt, then
        # the outputs kept) while it is cached: the next turn's lookup checks those ids with two
        # comparisons and walks the tree only below that node (RadixCache.match_from).
        self._history: OrderedDict[bytes, Node] = OrderedDict()

    # -- prefix ----------------------------------------------------------------------------------
    def _match(self, req: Req, touch: bool) -> tuple[int, Node]:
        ids = req.pb if req.target == req.L else req.seq_bytes()
        node = self._history.get(ids[:HISTORY_KEY_BYTES])
        if node is not None and node.spelt is not None:  # spelt is None once the node was evicted
            prompt, outs = node.spelt
            if ids.startswith(prompt) and ids.startswith(outs, len(prompt)):
                return self.tree.match_from(node, (len(prompt) + len(outs)) // 4, ids, req.target - 1, touch)
        return self.tree.match_from(self.tree.root, 0, ids, req.target - 1, touch)

    def match(self, req: Req, touch: bool = True) -> int:
        if not self.caching:
            req.node = None
            return 0
        n, node = self._match(req, touch)
        req.node = node
        return n

    def touch(self, req: Req) -> None:
        """LRU refresh of a waiting request's cached prefix (SGLang's periodic waiting refresh)."""
        if self.caching:
            self._match(req, True)

    # -- admission budget --------------------------------------------------------------------------
    def free_slots(self) -> int:
        return self.M - self.own - self.tree.total

    def free_and_evictable(self, req: Req | None = None) -> int:
        """Free slots plus evictable cached tokens, with `req`'s matched prefix pinned (PrefillAdder
        locks a candidate's prefix while it checks the budget, so that prefix does not count)."""
        node = req.node if req is not None else None
        if node is None or not self.caching:
            return self.free_slots() + self.tree.evictable
        return self.free_slots() + self.tree.evictable_if_locked(node)

    def fits(self, req: Req, need: int) -> bool:
        """`need < free_and_evictable(req)`, the admission test, without walking req's matched
        path when the answer is clear anyway: pinning a path takes at most the tokens it spells
        (Node.depth) from the evictable ones, so if `need` fits below that bound it fits."""
        base = self.M - self.own - self.tree.total + self.tree.evictable
        node = req.node
        if node is None or not self.caching or need < base - node.depth:
            return need < base
        return need < self.free_slots() + self.tree.evictable_if_locked(node)

    def admit(self, req: Req, prefix: int) -> None:
        req.in_tree = prefix
        if req.node is not None:
            self.tree.lock(req.node)

    # -- slots -------------------------------------------------------------------------------------
    def _room(self, n: int) -> None:
        short = n - self.free_slots()
        if short > 0:
            self.tree.evict(short)
            if self.free_slots() < n:
                raise AssertionError("KV pool exhausted (the admission budget should have prevented this)")

    def alloc(self, req: Req, n: int) -> bool:
        """Slots for n more prefill tokens of `req`."""
        if n > self.M - self.own - self.tree.total:  # free_slots(), written out: most calls fit
            self._room(n)
        self.own += n
        return True

    def grow(self, n: int) -> None:
        """Slots for n decode tokens across the running requests (one per request per iteration)."""
        if n > self.M - self.own - self.tree.total:  # free_slots(), written out: most calls fit
            self._room(n)
        self.own += n

    def checkpoint(self, req: Req, upto: int) -> None:
        """Put req's first `upto` tokens (page-aligned) into the tree, locked by req."""
        if not self.caching:
            return
        aligned = (upto // self.page) * self.page
        if aligned <= req.in_tree:
            return
        if aligned <= req.L:
            ids, offset = req.pb, 0
        else:  # the prompt's tail past what the tree holds, and the outputs: no copy of the rest
            offset = min(req.in_tree, req.L) if req.node is not None and req.in_tree > 0 else 0
            ids = req.pb[offset * 4 :] + req.outb[: (aligned - req.L) * 4]
        if req.node is not None and req.in_tree > 0:  # resume the walk at the request's own locked node
            _new, node = self.tree.insert_from(req.node, req.in_tree, ids, aligned, offset, lock=True)
        else:
            _new, node = self.tree.insert_from(self.tree.root, 0, ids, aligned, offset, lock=True)
        self.own -= aligned - req.in_tree  # moved into the tree, or freed as duplicates of cached content
        if req.node is not None:
            self.tree.unlock(req.node)
        req.node = node
        req.in_tree = aligned

    def finish(self, req: Req) -> None:
        """Insert prompt + outputs less the last token (its KV was never computed), unlock, free the rest."""
        kept = req.L + req.max_tokens - 1
        self.checkpoint(req, kept)
        self.own -= kept - req.in_tree  # the unaligned tail (or everything, with caching off)
        node = req.node
        if node is not None:
            self.tree.unlock(node)
            if node is not self.tree.root and req.in_tree * 4 >= HISTORY_KEY_BYTES:
                held = req.in_tree
                prompt = req.pb if held >= req.L else req.pb[: held * 4]
                outs = req.outb[: max(0, held - req.L) * 4]
                key = prompt[:HISTORY_KEY_BYTES]
                node.spelt = (prompt, outs)
                _remember(self._history, key, node, HISTORY_SESSIONS)
        req.node = None
        req.in_tree = 0

    def flush(self) -> None:
        self.tree.reset()
        self._history.clear()

    # -- gauges ----------------------------------------------------------------------------------
    def used_running(self) -> int:
        return self.tree.protected + self.own

    def evictable(self) -> int:
        return self.tree.evictable

    def cached_total(self) -> int:
        return self.tree.total


SEQ_SESSIONS = 1024  # sessions whose last keyed sequence is kept for their next turn (vLLM flavour)


class _KeyedSeq(NamedTuple):
    """A request's keyed sequence, kept for its session's next turn (BlockKV._keys)."""

    pb: bytes  # prompt ids as bytes
    outb: bytes  # output ids as bytes
    raw: np.ndarray  # unmixed prefix sums of its full blocks (PrefixHasher.raw_sums)
    key_array: np.ndarray  # their keys, uint64
    keys: list[int]  # the same keys as a list


def _reusable_blocks(req: Req, prev: _KeyedSeq, nblocks: int, block: int) -> int:
    """How many of the leading full blocks of req's sequence (prompt, then outputs) are the full
    blocks of the earlier sequence `prev` (its prompt and output bytes), token for token: all of
    prev's, or 0 (then req is keyed from its first token). Only a prompt that holds them is
    checked, the common case: a turn's prompt is its session's history."""
    ppb, poutb = prev.pb, prev.outb
    m = prev.raw.size
    nbytes = m * block * 4
    if m == 0 or m > nblocks or len(req.pb) < nbytes:
        return 0
    if nbytes <= len(ppb):
        return m if req.pb.startswith(ppb[:nbytes]) else 0
    rest = nbytes - len(ppb)
    return m if req.pb.startswith(ppb) and req.pb.startswith(poutb[:rest], len(ppb)) else 0


_NO_BLOCKS = np.empty(0, dtype=np.int64)  # a request's hit blocks when it has none
NULL_BLOCKS = 1  # vLLM's BlockPool pops block 0 as its null block at start


class BlockKV:
    def __init__(self, pool_tokens: int, block: int, caching: bool) -> None:
        # vLLM sizes the pool in blocks (pool_tokens // block, its num_gpu_blocks) and keeps block 0
        # as a placeholder "null block" that is never allocated, so one block fewer is usable.
        self.B = block
        usable = pool_tokens // block - NULL_BLOCKS
        if usable < 1:
            raise ValueError(f"KV pool of {pool_tokens} tokens holds no usable {block}-token block")
        self.M = usable * block
        self.caching = caching
        self.pool = BlockPool(usable, block, caching)
        # A finished request's cached blocks by the key of its first block (a session's turns all
        # start with the same blocks): the next turn's lookup validates these entries at once and
        # reads the hash maps only for what follows them (BlockPool.lookup_entries' `known`).
        self._history: OrderedDict[int, tuple[np.ndarray, int]] = OrderedDict()
        # A session's last keyed sequence by its first ids, from which its next turn's keys continue
        self._seqs: OrderedDict[bytes, _KeyedSeq] = OrderedDict()

    def _keys(self, req: Req, nblocks: int) -> list[int]:
        """Prefix keys of req's first nblocks blocks. The whole sequence (prompt and every output
        id, known at submission) is keyed once, so caching blocks as they fill costs O(1) each.

        A session's turn starts with its last turn's whole sequence, so the keys of that part are
        the last turn's: when the request's leading bytes are the last turn's sequence (compared,
        not assumed), only the blocks after it are summed, from the last turn's running sum
        (PrefixHasher.raw_sums: exact modular sums, so the keys are the ones a full pass gives)."""
        if req.keys_len < 0:
            total = req.L + req.max_tokens
            nb = total // self.B
            hasher = self.pool.hasher
            sid = req.pb[:HISTORY_KEY_BYTES]
            prev = self._seqs.get(sid)
            m = _reusable_blocks(req, prev, nb, self.B) if prev is not None else 0
            if m:
                assert prev is not None
                new_raw = hasher.raw_sums((req.prompt, req.out), nb, m, int(prev.raw[m - 1]))
                raw = np.concatenate((prev.raw[:m], new_raw))
                new_keys = hasher.mix(new_raw, copy=False)  # (raw holds a copy of the sums)
                req.key_array = np.concatenate((prev.key_array[:m], new_keys))
                req.keys = (prev.keys if m == len(prev.keys) else prev.keys[:m]) + new_keys.tolist()
            else:
                raw = hasher.raw_sums((req.prompt, req.out), nb)
                req.key_array = hasher.mix(raw)
                req.keys = req.key_array.tolist()
            req.keys_len = total
            if nb:
                _remember(self._seqs, sid, _KeyedSeq(req.pb, req.outb, raw, req.key_array, req.keys), SEQ_SESSIONS)
        return req.keys[:nblocks]

    def _cache_full(self, req: Req, tokens: int) -> None:
        """Hash req's blocks that `tokens` scheduled tokens fill (vLLM caches at schedule time)."""
        nfull = tokens // self.B
        if self.caching and nfull > req.ncached:
            if req.keys_len < 0:
                self._keys(req, 0)
            c = req.ncached
            if nfull == c + 1:  # one block filled: a decode token's, or a chunk's last
                self.pool.register_one(req.blocks[c], req.keys[c])
            else:
                self.pool.register(req.blocks[c:nfull], req.keys[c:nfull], req.key_array[c:nfull])
            req.ncached = nfull

    def match(self, req: Req, touch: bool = True) -> int:
        if not self.caching:
            req.hit = _NO_BLOCKS
            return 0
        maxb = (req.target - 1) // self.B
        if req.keys_len < 0:
            self._keys(req, 0)
        known = req.hit_entries
        if known is None and req.keys:
            past = self._history.pop(req.keys[0], None)
            if past is not None and past[0].size <= len(req.keys) and req.keys[past[0].size - 1] == past[1]:
                known = past[0]  # the same leading blocks: the same prefix keys, the same entries
        ents = self.pool.lookup_entries(req.keys, maxb, known)
        req.hit_entries = ents
        # an array, not a list: the admission checks index the pool's arrays with it, and only an
        # admission turns it into the request's block list
        req.hit = ents % self.pool.num_blocks
        return len(req.hit) * self.B

    def _new_blocks(self, req: Req, tokens: int) -> int:
        return max(0, -(-tokens // self.B) - len(req.blocks))

    def can_admit(self, req: Req, prefix: int, first_chunk: int) -> bool:
        """vLLM 0.32 admits a waiting or preempted request only if its *whole* current sequence
        (prompt, plus the outputs so far after a preemption) fits the free blocks, not just the
        first chunk (`scheduler_reserve_full_isl`, on by default: KVCacheManager.allocate_slots
        with full_sequence_must_fit). Only the first chunk is allocated now; the rest comes chunk
        by chunk. Free blocks include cached ones; hit blocks taken out of the free queue count."""
        full = max(prefix + first_chunk, req.target)
        new = max(0, -(-full // self.B) - len(req.hit))
        return self.pool.needed(req.hit, new) <= self.pool.free_count()

    def admit(self, req: Req, prefix: int) -> None:
        """Take req's hit blocks: they lead its block list. The hit array stays in `req.hit` while
        it runs (nothing reads it until a lookup replaces it), so that its release converts only
        the blocks allocated since (`_block_array`): in a healthy run the hit is a whole session's
        history, hundreds of blocks, and its conversion was the largest cost of a turn's finish.
        While `req.hit` holds all of req's blocks, a chunk's blocks join it (`alloc`): in the trap
        a prompt's blocks are allocated chunk by chunk as arrays, and hit nothing."""
        hit = req.hit
        self.pool.take(hit)
        if isinstance(hit, np.ndarray):
            req.blocks = hit.tolist()
        else:
            req.blocks = list(hit)
            req.hit = np.asarray(hit, dtype=np.int64)
        req.ncached = len(hit)
        req.hit_entries = None

    @staticmethod
    def _block_array(req: Req) -> np.ndarray:
        """req.blocks as an int64 array: `req.hit`, the array of req.blocks' leading blocks (the
        admitted hit and the chunks allocated while it held them all: BlockKV.admit, alloc), and
        the blocks allocated since."""
        hit = req.hit
        nh = len(hit)
        if not nh or not isinstance(hit, np.ndarray):
            return np.fromiter(req.blocks, dtype=np.int64, count=len(req.blocks))  # (faster than np.array)
        rest = req.blocks[nh:]
        if not rest:
            return hit
        return np.concatenate((hit, np.fromiter(rest, dtype=np.int64, count=len(rest))))

    def alloc(self, req: Req, n: int) -> bool:
        """Blocks so that req.done + n tokens fit; False (nothing taken) if too few are free.
        The blocks those tokens fill are cached at once."""
        tokens = req.done + n
        need = self._new_blocks(req, tokens)
        pool = self.pool
        if need > pool.free_count():
            return False
        if need > pool.SMALL:  # a chunk's blocks: hashed from the array they come in
            c = req.ncached
            fresh = c == len(req.blocks)  # the blocks the chunk fills are all new ones
            arr = pool.allocate_array(need)
            hit = req.hit
            if isinstance(hit, np.ndarray) and len(hit) == len(req.blocks):  # the array leads on
                req.hit = np.concatenate((hit, arr)) if len(hit) else arr
            req.blocks += arr.tolist()
            nfull = tokens // self.B
            if fresh and self.caching and nfull > c and req.keys_len >= 0:
                pool.register(arr[: nfull - c], req.keys[c:nfull], req.key_array[c:nfull])
                req.ncached = nfull
                return True
        elif need:
            req.blocks.extend(pool.allocate(need))
        self._cache_full(req, tokens)
        return True

    def grow_req(self, req: Req, tokens: int) -> bool:
        """Blocks for a decode step that brings req's KV to `tokens` tokens."""
        B = self.B
        if tokens <= len(req.blocks) * B and (not self.caching or tokens // B <= req.ncached):
            return True  # most decode steps: the token goes into the last block, which does not fill
        need = self._new_blocks(req, tokens)
        if need > self.pool.free_count():
            return False
        if need:
            req.blocks.extend(self.pool.allocate(need))
        self._cache_full(req, tokens)
        return True

    def _free(self, req: Req, computed: int, blocks: np.ndarray | None = None) -> None:
        """`blocks`: req.blocks as an array, if the caller made one (each conversion of a long
        block list costs about as much as the operation it feeds)."""
        self._cache_full(req, computed)
        self.pool.release(self._block_array(req) if blocks is None else blocks)
        req.blocks = []
        req.hit = _NO_BLOCKS
        req.ncached = 0

    def finish(self, req: Req) -> None:
        kept = req.L + req.max_tokens - 1
        blocks = None
        if self.caching:
            self._cache_full(req, kept)
            blocks = self._block_array(req)
            ents = self.pool.first_entries(blocks[: req.ncached])
            if ents.size:
                _remember(self._history, req.keys[0], (ents, req.keys[ents.size - 1]), HISTORY_SESSIONS)
        self._free(req, kept, blocks)

    def preempt(self, req: Req, computed: int) -> None:
        self._free(req, computed)

    def flush(self) -> None:
        self.pool.reset()
        self._history.clear()
        self._seqs.clear()  # (keys are a function of the ids alone: this only frees the memory)

    # -- gauges ----------------------------------------------------------------------------------
    def used_running(self) -> int:
        return self.pool.used_blocks * self.B

    def evictable(self) -> int:
        return self.pool.free_cached * self.B

    def cached_total(self) -> int:
        return self.pool.n_hashed * self.B
