"""Fused decode steps for the vLLM flavour: many decode-only steps planned as one iteration.

A vLLM step is one mixed iteration, so a healthy run (nothing waiting, every running request
decoding) is hundreds of thousands of steps in which nothing happens but one token per request
and, now and then, a block that fills (and is hashed) or a new block taken from the free queue.
While that lasts and no event can intervene, the steps are planned at once: the same block
operations in the same order (step by step, running order within a step), the same step
durations added in the same order, so every record is what stepping one at a time gives
(tests/unit/harness/test_refengine_fastpaths.py compares both, gauges included).

A run is fused only if every step of it ends *before* the horizon (the driver's next event): the
step in progress when an event comes is then a single step, as without fusion, so whatever the
event reads (a gauge sample) or changes (a request arrives) sees the same engine. It stops at the
next finish (that step may be the last of the run) and before any step whose new blocks the free
queue could not supply (that step preempts, and is planned the ordinary way).
"""

from __future__ import annotations

import heapq
from typing import Any

#: at most this many steps are planned at once (bounds the work done ahead of a preemption check)
MAX_FUSED = 4096


def plan_fused_decode(m: Any, now: float, horizon: float | None) -> float | None:
    """Plan a run of decode-only steps on the vLLM-flavour engine `m` (harness/refengine/vllm.py); its end time, or None
    when fewer than two steps can be fused (the caller then plans one step as usual; nothing was
    changed)."""
    if horizon is None or m.waiting or m.prefilling:
        return None
    R = m.n_decode
    running = m.running
    if R == 0 or len(running) != R or m.chunk < R:
        return None
    kmax = min(m._finish[0][0] - m.dstep, MAX_FUSED) if m._finish else 1
    if kmax < 2:
        return None
    ends: list[float] = m.cost.mixed_decode_ends(now, R, m.ctx_sum, kmax, horizon)
    k = len(ends)
    if k < 2:
        return None
    kv = m.kv
    B = kv.B
    caching = kv.caching
    dstep = m.dstep
    # each decoder's next block event: the step whose token overflows its blocks, or fills a block
    # (the first step i >= 0 at which grow_req(req, t0 + i) does more than return True)
    events: list[tuple[int, int, Any, int]] = []
    for order, req in enumerate(running.values()):
        t0 = req.L + req.gen + (dstep - req.join)  # its KV after step 0
        i = len(req.blocks) * B + 1 - t0
        if caching:
            j = (req.ncached + 1) * B - t0
            if j < i:
                i = j
        if i < k:
            events.append((i if i > 0 else 0, order, req, t0))
    heapq.heapify(events)
    pool = kv.pool
    pop, push = heapq.heappop, heapq.heappush
    while events and events[0][0] < k:
        step = events[0][0]
        due = [pop(events)]
        while events and events[0][0] == step:
            due.append(pop(events))
        new_blocks = 0  # kv._new_blocks of each, summed
        for _i, _o, req, t0 in due:
            nb = -(-(t0 + step) // B) - len(req.blocks)
            if nb > 0:
                new_blocks += nb
        if new_blocks > pool._nfree:  # this step preempts: it is planned the ordinary way
            if step == 0:
                return None  # nothing was changed
            k = step  # the steps before it run (step 0 alone is an ordinary step)
            break
        for _i, order, req, t0 in due:  # running order within the step, as the step loop goes
            # kv.grow_req(req, t0 + step), the free blocks checked above: a new block (one, as a
            # decode token needs) and the block the token fills, hashed as _cache_full does
            tok = t0 + step
            blocks = req.blocks
            nb = -(-tok // B) - len(blocks)
            if nb == 1:
                blocks += pool._allocate_few(1)
            elif nb > 1:
                blocks += pool.allocate(nb)
            if caching:
                c = req.ncached
                nfull = tok // B
                if nfull == c + 1 and req.keys_len >= 0:
                    pool.register_one(blocks[c], req.keys[c])
                    req.ncached = nfull
                elif nfull > c:
                    kv._cache_full(req, tok)
            i = len(blocks) * B + 1 - t0
            if caching:
                j = (req.ncached + 1) * B - t0
                if j < i:
                    i = j
            if i < k:
                push(events, (i if i > 0 else 0, order, req, t0))
    m._pending = ("mixed", k, [])
    return ends[k - 1]
