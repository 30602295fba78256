"""The reference engine model: a clock-free continuous-batching engine (paper SPEC §3, App. E.9, E.12).

Requests go in with `submit`; the driver asks for the next iteration with `step(now)`, waits
(virtually or really) until the returned end time and applies it with `complete(end)`. Nothing
here reads a clock, sleeps or does I/O, so the same model runs in the discrete-event simulator
and behind the HTTP emulator.

Iterations:
- separate (SGLang): a prefill iteration whenever a prefill batch can be formed (a chunked request
  continues first, then waiting requests are admitted into the remaining chunk budget); otherwise
  one decode iteration over every decoding request. Decode stalls while prefills run.
- mixed (vLLM): one iteration carries a decode token for every decoding request plus prefill
  chunks in the remaining token budget; a waiting request is admitted only if its whole sequence
  fits the free blocks (vLLM's default admission gate), though only its first chunk is allocated;
  when a block cannot be allocated, the most recently admitted running request is preempted (KV
  freed, recomputed later from the head of the queue), and nothing is admitted in that step.

While only decoding happens and nothing can change, `step(now, horizon)` fuses the decode
iterations that start before `horizon` (the driver's next event) into one; the boundaries are the
same as stepping one by one, so results do not depend on fusion. The vLLM flavour fuses its
decode-only steps that *end* before `horizon` (harness/refengine/fused.py), with the same block
operations and the same float sums as stepping, so its records are identical either way.
"""

from __future__ import annotations

import heapq
import math

from harness.config import CellConfig
from harness.refengine.fused import plan_fused_decode
from harness.refengine.kv import BlockKV, TokenKV
from harness.refengine.request import EngineCompletion, EngineRequest, Req
from harness.refengine.scheduler import WaitingPolicy
from harness.refengine.separate import CLIP_MAX_NEW, SeparateBatching

__all__ = ["EngineCompletion", "EngineModel", "EngineRequest"]


class EngineModel(SeparateBatching):
    def __init__(self, cell: CellConfig, *, seed: int = 0) -> None:
        self.cell = cell
        self.cost = cell.cost.model()
        self.seed = seed
        radix = cell.engine.name == "sglang"
        if radix:
            self.kv: TokenKV | BlockKV = TokenKV(cell.kv_pool_tokens, cell.page_size, cell.prefix_cache)
        else:
            self.kv = BlockKV(cell.kv_pool_tokens, cell.page_size, cell.prefix_cache)
        self.mixed = cell.batching == "mixed"
        self.chunk = cell.chunked_prefill
        # A chunk that stops short of a request's end is page-aligned on SGLang (extend_len is cut to
        # whole pages); vLLM cuts chunks at the token budget, to the token.
        self.page = cell.page_size if radix else 1
        self.max_running = cell.max_running
        self.policy = WaitingPolicy(cell, self.kv, radix)
        self.waiting: list[Req] = []
        self.running: dict[int, Req] = {}  # admission order (the preemption order is its reverse)
        self.prefilling: list[Req] = []  # admitted, prefill not complete (admission order)
        self.n_decode = 0
        self.ctx_sum = 0  # summed context of decoding requests (drives decode attention cost)
        # What the decoding requests will still decode, kept as it changes so the radix admission
        # budget (separate.py: _decode_offset) costs O(1), not O(running), per prefill round: a
        # request decodes max_tokens - gen - (dstep - join) more tokens, so the sum over decoders
        # with at most CLIP_MAX_NEW left at their join is _left_sum - _left_n * dstep; the few
        # that start above the clip are summed one by one (_left_big).
        self._left_sum = 0
        self._left_n = 0
        self._left_big: dict[int, Req] = {}
        self.dstep = 0  # decode iterations so far; a decoding request's count derives from it
        self._finish: list[tuple[int, int, int, Req]] = []  # (dstep at which done, seq, stint, req)
        self._batch_full = False
        self._unfiltered = 0
        self._merge_reset = False
        self.radix = radix
        self._pending: tuple | None = None
        self._now = 0.0  # start of the iteration being planned (admission times)
        self._seq = 0
        self._ids: set[int] = set()
        self.counters = {"prompt": 0, "cached": 0, "generated": 0, "preemptions": 0}

    # -- public API ------------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> None:
        """Queue a request. Raises ValueError for requests the engine would refuse (HTTP 400)."""
        n = len(req.prompt)
        ctx = self.cell.context_length
        if n < 1:
            raise ValueError("prompt: got 0 tokens; expected at least 1")
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        if self.cell.engine.name == "sglang" and n >= ctx:
            raise ValueError(f"prompt of {n} tokens exceeds the context length {ctx}")
        if n + req.max_tokens > ctx:
            raise ValueError(f"prompt of {n} tokens plus max_tokens {req.max_tokens} exceeds the context length {ctx}")
        if n + req.max_tokens > self.kv.M:
            raise ValueError(f"request of {n + req.max_tokens} tokens can never fit the KV pool of {self.kv.M}")
        if req.req_id in self._ids:
            raise ValueError(f"request id {req.req_id} is already in the engine")
        self._ids.add(req.req_id)
        self._seq += 1
        self.waiting.append(Req(req, now, self._seq, self.seed))

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def iteration(self) -> tuple[str, int] | None:
        """The iteration in progress as (kind, decode steps it covers), None between iterations.

        kind is 'prefill', 'decode' or 'mixed'; the HTTP emulator reports SGLang's gauges on the
        same events as SGLang does (each prefill batch, every 40th decode step)."""
        return None if self._pending is None else (self._pending[0], int(self._pending[1]))

    def step(self, now: float, horizon: float | None = None) -> float | None:
        """Plan and start the next iteration at `now`; its end time, or None when idle.

        `horizon` (optional): no external event can happen before it, so consecutive decode-only
        iterations that start before it may be fused into one step.
        """
        if self._pending is not None:
            raise RuntimeError("step() while an iteration is in progress")
        self._now = now
        if not self.waiting and not self.running:
            return None
        if self.mixed:
            return self._plan_mixed(now, horizon)
        return self._plan_separate(now, horizon)

    def complete(self, now: float) -> list[EngineCompletion]:
        """Apply the iteration in progress (it ends at `now`); returns the requests it finished."""
        if self._pending is None:
            raise RuntimeError("complete() with no iteration in progress")
        kind, k, items = self._pending
        self._pending = None
        out: list[EngineCompletion] = []
        if k:
            self._advance_decode(k, now, out)
        chunking = False
        for req, _x in items:
            if req.state == "prefill":
                if req.done >= req.target:
                    self._prefill_done(req, now, out)
                else:
                    chunking = True
                    if self.radix:
                        self.kv.checkpoint(req, req.done)  # type: ignore[union-attr]
        if self.radix:
            if kind == "prefill":
                self._merge_reset = self._merge_reset or bool(out) or chunking
            else:
                self._unfiltered += len(out)
        return out

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False, nothing changed) while any request runs or waits."""
        if self.waiting or self.running or self._pending is not None:
            return False
        self.kv.flush()
        return True

    def gauges(self) -> dict[str, float]:
        c = self.counters
        return {
            "running": float(len(self.running)),
            "waiting": float(len(self.waiting)),
            "kv_used_tokens": float(self.kv.used_running()),
            "kv_evictable_tokens": float(self.kv.evictable()),
            "pool_tokens": float(self.kv.M),
            "prompt_tokens_total": float(c["prompt"]),
            "cached_tokens_total": float(c["cached"]),
            "generation_tokens_total": float(c["generated"]),
            "preemptions_total": float(c["preemptions"]),
        }

    # -- admission -------------------------------------------------------------------------------
    def _admit(self, budget: int, items: list[tuple[Req, int]]) -> tuple[int, float]:
        """Admit waiting requests in queue order into `budget` prefill tokens.

        Returns (tokens, causal pairs) of the chunks added to `items`."""
        waiting = self.waiting
        kv = self.kv
        page = self.page
        tokens = 0
        pairs = 0.0
        k = 0
        for req in waiting:
            if len(self.running) >= self.max_running:
                self._batch_full = True
                break
            prefix = kv.match(req, True)
            x = req.target - prefix
            chunk = x if x <= budget else (budget // page) * page
            if chunk <= 0:
                break
            if not kv.can_admit(req, prefix, chunk):
                self._batch_full = True
                break
            kv.admit(req, prefix)
            req.prefix = prefix
            req.done = prefix
            kv.alloc(req, chunk)
            req.done = prefix + chunk
            req.state = "prefill"
            if req.cached < 0:
                req.cached = prefix
                req.admitted = self._now
                self.counters["prompt"] += req.L
                self.counters["cached"] += prefix
            self.running[req.rid] = req
            self.prefilling.append(req)
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

    def _continue_prefills(self, budget: int, items: list[tuple[Req, int]]) -> tuple[int, float, int]:
        """Next chunks of admitted requests whose prefill is unfinished (they go first)."""
        tokens = 0
        pairs = 0.0
        page = self.page
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req.state != "prefill":
                continue
            rem = req.target - req.done
            x = rem if rem <= budget else (budget // page) * page
            if x <= 0:
                break
            while not self.kv.alloc(req, x):
                victim = self._preempt_last()
                if victim is req:
                    x = 0
                    break
            if x <= 0 or req.state != "prefill":
                continue
            items.append((req, x))
            tokens += x
            pairs += x * (req.done + (x + 1) / 2.0)
            req.done += x
            budget -= x
        return tokens, pairs, budget

    # -- iteration planning ----------------------------------------------------------------------
    def _plan_separate(self, now: float, horizon: float | None) -> float | None:
        if self.radix:
            return self._plan_radix(now, horizon)
        items: list[tuple[Req, int]] = []
        tokens, pairs, budget = self._continue_prefills(self.chunk, items)
        if budget > 0 and self.waiting and not self._batch_full:
            self.policy.order(self.waiting)
            t2, p2 = self._admit(budget, items)
            tokens += t2
            pairs += p2
        if items:
            self._pending = ("prefill", 0, items)
            return now + self.cost.prefill_iteration(tokens, pairs)
        if self.n_decode:
            return self._plan_decode(now, horizon)
        return None  # only blocked waiting requests: nothing can run (cannot happen under reservations)

    def _plan_decode(self, now: float, horizon: float | None) -> float:
        R = self.n_decode
        if self.kv.per_request_decode:
            if not self._grow_decoders():  # every decoder was preempted: their recompute comes first
                return self._plan_separate(now, horizon)
            R = self.n_decode
            self._pending = ("decode", 1, [])
            return now + self.cost.decode_time(R, self.ctx_sum / R)
        kmax = self._finish[0][0] - self.dstep if self._finish else 1
        if self.waiting and not self._batch_full:
            kmax = 1  # the next iteration attempts admission
        budget = 0.0 if horizon is None else horizon - now
        k, dur = self.cost.decode_run(R, self.ctx_sum, max(1, kmax), budget)
        self.kv.grow(k * R)  # type: ignore[union-attr]
        self._pending = ("decode", k, [])
        return now + dur

    def _grow_decoders(self) -> bool:
        """Blocks for every decoding request's next token, preempting from the tail if short.
        False if preemption emptied the decode set."""
        kv = self.kv
        for req in list(self.running.values()):
            if req.state != "decode":
                continue
            tokens = req.L + req.gen + (self.dstep - req.join)
            while not kv.grow_req(req, tokens):  # type: ignore[union-attr]
                victim = self._preempt_last()
                if victim is req:
                    break
        return self.n_decode > 0

    def _plan_mixed_blocks(self, now: float) -> float | None:
        """One vLLM step (Scheduler.schedule, FCFS): running requests in their order, each taking
        its next token (decode) or the next chunk of its prefill within the step's token budget
        and allocating the blocks for it; when blocks run short the last running request is
        preempted (it may be the request itself, which ends the pass). Waiting requests are
        admitted into the remaining budget only if nothing was preempted, and admission is tried
        again at every step (vLLM keeps no "batch is full" state)."""
        kv = self.kv
        budget = self.chunk
        items: list[tuple[Req, int]] = []
        tokens = 0
        pairs = 0.0
        preempted = False
        running = self.running
        for req in list(running.values()):
            if budget <= 0:
                break
            if req.rid not in running:
                continue  # preempted earlier in this pass
            if req.state == "decode":
                need = req.L + req.gen + (self.dstep - req.join)
                while not kv.grow_req(req, need):  # type: ignore[union-attr]
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
        return now + self.cost.mixed_iteration(tokens, pairs, R, float(self.ctx_sum))

    def _plan_mixed(self, now: float, horizon: float | None) -> float | None:
        if self.kv.per_request_decode:
            end = plan_fused_decode(self, now, horizon)
            return end if end is not None else self._plan_mixed_blocks(now)
        # SGLang with mixed chunks: the prefill round takes the budget left by one decode token per
        # running request, and the decoders ride along in the prefill iteration
        R = self.n_decode
        if self._merge_reset:
            self._batch_full = False
            self._merge_reset = False
        if not self.running:
            self._batch_full = False
        chunked = self.prefilling[0] if self.prefilling else None
        items: list[tuple[Req, int]] = []
        tokens, pairs = 0, 0.0
        if (chunked is not None or (self.waiting and not self._batch_full)) and (
            chunked is not None or self._allocatable(None) > 0
        ):
            self.policy.calc_priority(self.waiting)
            tokens, pairs = self._prefill_round(chunked, items, self.chunk - R)
        elif chunked is None and self.waiting and not self._batch_full:
            self._batch_full = True
        if not items and not R:
            return None
        if not items:
            if self._unfiltered:
                self._unfiltered = 0
                self._batch_full = False
            return self._plan_decode(now, horizon)
        if R:
            self.kv.grow(R)  # type: ignore[union-attr]
        self._pending = ("mixed", 1 if R else 0, items)
        return now + self.cost.mixed_iteration(tokens, pairs, R, float(self.ctx_sum))

    # -- state transitions -----------------------------------------------------------------------
    def _advance_decode(self, k: int, now: float, out: list[EngineCompletion]) -> None:
        R = self.n_decode
        self.dstep += k
        self.ctx_sum += k * R
        self.counters["generated"] += k * R
        fin = self._finish
        while fin and fin[0][0] <= self.dstep:
            _, _, stint, req = heapq.heappop(fin)
            if req.stint != stint or req.state != "decode":
                continue  # preempted since it was queued
            self._finish_req(req, now, out)

    def _prefill_done(self, req: Req, now: float, out: list[EngineCompletion]) -> None:
        """The prefill produced one token: the first, or the next after a recompute."""
        self.prefilling.remove(req)
        req.gen += 1
        self.counters["generated"] += 1
        if math.isnan(req.first_token):
            req.first_token = now
        if req.gen >= req.max_tokens:
            req.state = "decode"
            self.n_decode += 1
            self.ctx_sum += req.L + req.gen
            req.join = self.dstep
            self._left_join(req)
            self._finish_req(req, now, out)
            return
        if self.radix:
            self.kv.checkpoint(req, req.target)  # type: ignore[union-attr]
        req.state = "decode"
        req.join = self.dstep
        req.stint += 1
        self.n_decode += 1
        self.ctx_sum += req.L + req.gen
        self._left_join(req)
        self._seq += 1
        heapq.heappush(self._finish, (self.dstep + req.max_tokens - req.gen, self._seq, req.stint, req))

    def _left_join(self, req: Req) -> None:
        """`req` starts a decode stint (gen and join fixed until it ends): count what it has left."""
        if req.max_tokens - req.gen > CLIP_MAX_NEW:
            self._left_big[req.rid] = req
        else:
            self._left_sum += req.max_tokens - req.gen + req.join
            self._left_n += 1

    def _left_leave(self, req: Req) -> None:
        """`req`'s decode stint ends (finished or preempted), before its gen or join change."""
        if self._left_big.pop(req.rid, None) is None:
            self._left_sum -= req.max_tokens - req.gen + req.join
            self._left_n -= 1

    def decode_left(self) -> int:
        """Tokens the decoding requests will still decode, each counted at most CLIP_MAX_NEW (the
        decode reservation of SGLang's admission budget)."""
        tot = self._left_sum - self._left_n * self.dstep
        for req in self._left_big.values():
            tot += min(req.max_tokens - req.gen - (self.dstep - req.join), CLIP_MAX_NEW)
        return tot

    def _finish_req(self, req: Req, now: float, out: list[EngineCompletion]) -> None:
        self._left_leave(req)
        self.n_decode -= 1
        self.ctx_sum -= req.L + req.max_tokens
        req.state = "done"
        self.kv.finish(req)
        del self.running[req.rid]
        self._ids.discard(req.rid)
        if not self.radix:
            self._batch_full = False
        out.append(
            EngineCompletion(
                req_id=req.rid,
                output_ids=req.out,
                prompt_tokens=req.L,
                cached_tokens=max(req.cached, 0),
                completion_tokens=req.max_tokens,
                submit_time=req.submit,
                first_token_time=req.first_token,
                done_time=now,
                preemptions=req.preemptions,
                admit_time=req.admitted,
            )
        )

    def _preempt_last(self) -> Req:
        """Preempt the most recently admitted running request: free its KV (full blocks stay cached)
        and put it at the head of the queue to be recomputed (vLLM's recompute preemption)."""
        if not self.kv.can_preempt:
            raise AssertionError("preemption in a reservation-gated engine (engine model bug)")
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
