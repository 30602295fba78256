"""KV memory of the two engine flavours behind one interface the scheduler uses.

TokenKV (SGLang): a pool of M token slots plus the radix cache. Admission is gated by
*reservations*: a running request reserves its prompt plus max_tokens from admission to
completion, and a request waits while admitting it would push the reservations past M (paper
App. E.9, S3-S4). Cached KV that no running request locks is evictable and never blocks admission;
it is evicted (LRU leaves) only when a running request needs the physical slots. Reservations make
retraction unnecessary, so this flavour never preempts.

BlockKV (vLLM): a pool of M/B blocks with hashed prefix caching. A waiting request is admitted only
if its whole sequence fits what is free right now (free blocks include cached ones, evicted on
reuse), but only the blocks of its first chunk are allocated; later chunks and decode tokens
allocate as they go, and a running request that cannot get a block forces a preemption.
"""

from __future__ import annotations

from harness.refengine.blocks import BlockPool
from harness.refengine.radix import RadixCache
from harness.refengine.request import Req


class TokenKV:
    per_request_decode = False
    can_preempt = False

    def __init__(self, pool_tokens: int, page_size: int, caching: bool) -> None:
        self.M = pool_tokens
        self.page = page_size
        self.caching = caching
        self.tree = RadixCache(page_size)
        self.reserved = 0
        self.own = 0  # slots held by running requests outside the tree (new prefill + decode tokens)

    # -- prefix ----------------------------------------------------------------------------------
    def match(self, req: Req, touch: bool = True) -> int:
        if not self.caching:
            req.node = None
            return 0
        n, node = self.tree.match(req.seq_bytes(), req.target - 1, touch)
        req.node = node
        return n

    def touch(self, req: Req) -> None:
        """LRU refresh of a waiting request's cached prefix (SGLang's periodic waiting refresh)."""
        if self.caching:
            self.tree.match(req.seq_bytes(), req.target - 1, True)

    # -- admission and allocation ----------------------------------------------------------------
    def can_admit(self, req: Req, prefix: int, first_chunk: int) -> bool:
        return self.reserved + req.L + req.max_tokens <= self.M

    def admit(self, req: Req, prefix: int) -> None:
        req.reserve = req.L + req.max_tokens
        self.reserved += req.reserve
        if req.node is not None:
            self.tree.lock(req.node)

    def _room(self, n: int) -> None:
        short = n - (self.M - self.own - self.tree.total)
        if short > 0:
            self.tree.evict(short)
            if self.M - self.own - self.tree.total < n:
                raise AssertionError("KV pool exhausted under reservations (engine model bug)")

    def alloc(self, req: Req, n: int) -> bool:
        """Slots for n more prefill tokens of `req`."""
        self._room(n)
        self.own += n
        return True

    def grow(self, n: int) -> None:
        """Slots for n decode tokens across the running requests (one per request per iteration)."""
        self._room(n)
        self.own += n

    def finish(self, req: Req) -> None:
        """Cache prompt + output minus the last token (its KV was never computed), free the rest."""
        held = (req.L - req.prefix) + (req.max_tokens - 1)
        self.own -= held
        if self.caching:
            full = req.pb + req.outb[: (req.max_tokens - 1) * 4]
            self.tree.insert(full)
            if req.node is not None:
                self.tree.unlock(req.node)
        req.node = None
        self.reserved -= req.reserve
        req.reserve = 0

    def preempt(self, req: Req, computed: int) -> None:  # pragma: no cover - never called
        raise AssertionError("the reservation-gated flavour does not preempt")

    def flush(self) -> None:
        self.tree.reset()

    # -- gauges ----------------------------------------------------------------------------------
    def used_running(self) -> int:
        return self.tree.protected + self.own

    def evictable(self) -> int:
        return self.tree.evictable

    def cached_total(self) -> int:
        return self.tree.total


NULL_BLOCKS = 1  # vLLM's BlockPool pops block 0 as its null block at start


class BlockKV:
    per_request_decode = True
    can_preempt = True

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

    def _keys(self, req: Req, nblocks: int) -> list[int]:
        """Prefix keys of req's first nblocks blocks. The whole sequence (prompt and every output
        id, known at submission) is keyed once, so caching blocks as they fill costs O(1) each."""
        if req.keys_len < 0:
            total = req.L + req.max_tokens
            req.keys = self.pool.hasher.keys(req.seq_tokens(total), total // self.B)
            req.keys_len = total
        return req.keys[:nblocks]

    def _cache_full(self, req: Req, tokens: int) -> None:
        """Hash req's blocks that `tokens` scheduled tokens fill (vLLM caches at schedule time)."""
        nfull = tokens // self.B
        if self.caching and nfull > req.ncached:
            self.pool.register(req.blocks[req.ncached : nfull], self._keys(req, nfull)[req.ncached :])
            req.ncached = nfull

    def match(self, req: Req, touch: bool = True) -> int:
        if not self.caching:
            req.hit = []
            return 0
        maxb = (req.target - 1) // self.B
        req.hit = self.pool.lookup(self._keys(req, maxb), maxb)
        return len(req.hit) * self.B

    def touch(self, req: Req) -> None:
        return None

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
        self.pool.take(req.hit)
        req.blocks = list(req.hit)
        req.ncached = len(req.hit)
        req.hit = []

    def alloc(self, req: Req, n: int) -> bool:
        """Blocks so that req.done + n tokens fit; False (nothing taken) if too few are free.
        The blocks those tokens fill are cached at once."""
        need = self._new_blocks(req, req.done + n)
        if need > self.pool.free_count():
            return False
        if need:
            req.blocks.extend(self.pool.allocate(need))
        self._cache_full(req, req.done + n)
        return True

    def grow_req(self, req: Req, tokens: int) -> bool:
        """Blocks for a decode step that brings req's KV to `tokens` tokens."""
        need = self._new_blocks(req, tokens)
        if need > self.pool.free_count():
            return False
        if need:
            req.blocks.extend(self.pool.allocate(need))
        self._cache_full(req, tokens)
        return True

    def _free(self, req: Req, computed: int) -> None:
        self._cache_full(req, computed)
        self.pool.release(req.blocks)
        req.blocks = []
        req.ncached = 0

    def finish(self, req: Req) -> None:
        self._free(req, req.L + req.max_tokens - 1)

    def preempt(self, req: Req, computed: int) -> None:
        self._free(req, computed)

    def flush(self) -> None:
        self.pool.reset()

    # -- gauges ----------------------------------------------------------------------------------
    def used_running(self) -> int:
        return self.pool.used_blocks * self.B

    def evictable(self) -> int:
        return self.pool.free_cached * self.B

    def cached_total(self) -> int:
        return self.pool.n_hashed * self.B
