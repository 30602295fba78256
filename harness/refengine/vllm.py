"""The vLLM flavour of the engine model: block KV, mixed batching, fused decode (vLLM V1, 0.32.0).

One step is one mixed iteration (Scheduler.schedule, FCFS): a decode token for every decoding
request plus prefill chunks in the remaining token budget. A waiting request is admitted only if
its whole sequence fits the free blocks (vLLM's default admission gate), though only its first
chunk is allocated; when a block cannot be allocated, the most recently admitted running request
is preempted (KV freed, recomputed later from the head of the queue), and nothing is admitted in
that step. vLLM keeps no "batch is full" state: admission is tried again at every step.

While nothing but decoding can happen, the decode-only steps that *end* before the driver's next
event are planned as one iteration (harness/refengine/fused.py), with the same block operations
and the same float sums as stepping, so the records are identical either way.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.config import CellConfig
from harness.refengine.base import BaseEngine
from harness.refengine.fused import plan_fused_decode
from harness.refengine.kv import BlockKV
from harness.refengine.request import Req

#: plans a run of decode-only steps (end time), or returns None having changed nothing
FusePlanner = Callable[["VLLMEngine", float, "float | None"], "float | None"]


class VLLMEngine(BaseEngine):
    """vLLM's scheduler over a hashed block pool with recompute preemption.

    `fuse`: the planner of fused decode-only steps (None: step one at a time, the direct form the
    fused one is checked against in tests/test_refengine_fastpaths.py)."""

    kv: BlockKV

    def __init__(self, cell: CellConfig, *, seed: int = 0, fuse: FusePlanner | None = plan_fused_decode) -> None:
        if cell.batching != "mixed":
            raise ValueError(
                f"cell {cell.name!r}: batching {cell.batching!r} on a vLLM cell; expected 'mixed' "
                "(vLLM schedules prefill chunks and decode tokens in one step)"
            )
        super().__init__(cell, seed=seed)
        self.kv = BlockKV(cell.kv_pool_tokens, cell.page_size, cell.prefix_cache)
        self.fuse = fuse

    def _plan(self, now: float, horizon: float | None) -> float | None:
        if self.fuse is not None:
            end = self.fuse(self, now, horizon)
            if end is not None:
                return end
        return self._plan_step(now)

    def _plan_step(self, now: float) -> float | None:
        """One vLLM step: running requests in their order, each taking its next token (decode) or
        the next chunk of its prefill within the step's token budget and allocating the blocks for
        it; when blocks run short the last running request is preempted (it may be the request
        itself, which ends the pass). Waiting requests are admitted into the remaining budget only
        if nothing was preempted."""
        kv = self.kv
        budget = self.chunk
        items: list[tuple[Req, int]] = []
        tokens = 0
        pairs = 0.0
        preempted = False
        running = self.running
        B = kv.B
        caching = kv.caching
        dstep = self.dstep  # (a preemption does not move it)
        for req in list(running.values()):
            if budget <= 0:
                break
            if preempted and req.rid not in running:
                continue  # preempted earlier in this pass
            if req.state == "decode":
                need = req.L + req.gen + (dstep - req.join)
                # most decode tokens go into the last block without filling it: BlockKV.grow_req's
                # first test, inlined (a trapped step walks every running request, a million a run)
                if need > len(req.blocks) * B or (caching and need // B > req.ncached):
                    while not kv.grow_req(req, need):
                        preempted = True
                        if self._preempt_last() is req:
                            break
                    if req.rid not in running:
                        break
                budget -= 1
            else:
                x = min(req.target - req.done, budget)
                while not kv.alloc(req, x):
                    preempted = True
                    if self._preempt_last() is req:
                        x = 0
                        break
                if x <= 0:
                    break
                items.append((req, x))
                tokens += x
                pairs += x * (req.done + (x + 1) / 2.0)
                req.done += x
                budget -= x
        if budget > 0 and self.waiting and not preempted:
            t2, p2 = self._admit(budget, items)
            tokens += t2
            pairs += p2
        R = self.n_decode
        if not items and not R:
            return None
        self._pending = ("mixed", 1 if R else 0, items)
        return now + self.cost.mixed_iteration(tokens, pairs, R, float(self.ctx_sum), self._take_admitted())

    def _admit(self, budget: int, items: list[tuple[Req, int]]) -> tuple[int, float]:
        """Admit waiting requests in queue order into `budget` prefill tokens (chunks cut at the
        budget, to the token); the scan stops at the first that does not fit.

        Returns (tokens, causal pairs) of the chunks added to `items`."""
        waiting = self.waiting
        kv = self.kv
        tokens = 0
        pairs = 0.0
        k = 0
        for req in waiting:
            if len(self.running) >= self.max_running:
                break
            prefix = kv.match(req, True)
            x = req.target - prefix
            chunk = x if x <= budget else budget
            if chunk <= 0:
                break
            if not kv.can_admit(req, prefix, chunk):
                break
            kv.admit(req, prefix)
            self._start_prefill(req, prefix)
            kv.alloc(req, chunk)
            req.done = prefix + chunk
            items.append((req, chunk))
            tokens += chunk
            pairs += chunk * (prefix + (chunk + 1) / 2.0)
            budget -= chunk
            k += 1
            if chunk < x or budget <= 0:
                break
        if k:
            del waiting[:k]
        return tokens, pairs

    def _preempt_last(self) -> Req:
        """Preempt the most recently admitted running request: free its KV (full blocks stay cached)
        and put it at the head of the queue to be recomputed (vLLM's recompute preemption)."""
        rid = next(reversed(self.running))
        req = self.running.pop(rid)
        if req.state == "decode":
            gen_now = req.gen + (self.dstep - req.join)
            computed = req.L + gen_now - 1
            self._left_leave(req)
            self.n_decode -= 1
            self.ctx_sum -= req.L + gen_now
            req.gen = gen_now
            req.target = req.L + gen_now
            req.stint += 1
        else:
            computed = req.done
            self.prefilling.remove(req)
        self.kv.preempt(req, computed)
        req.done = 0
        req.state = "waiting"
        req.preemptions += 1
        self.counters["preemptions"] += 1
        self.waiting.insert(0, req)
        return req
