"""The SGLang flavour of the engine model: token radix KV, separate prefill and decode rounds.

It follows SGLang 0.5.22 closely (Scheduler.get_next_batch_to_run / get_new_batch_prefill /
update_running_batch, PrefillAdder and PrefillBudget; checked decision by decision against that
code by sim2real/):

- prefill first: an iteration prefills whenever a prefill batch can be formed (the request being
  chunked continues first, then waiting requests are admitted in queue order), otherwise every
  decoding request decodes one token; decode stalls while prefills run. While only decoding can
  happen, the decode iterations that start before the driver's next event are fused into one step
  (the boundaries are the same as stepping one by one, so results do not depend on fusion);
- admission budget: a request is admitted only if its new tokens + max_tokens + one page are
  *below* free + evictable slots (its own matched prefix pinned) less what running requests will
  still decode and what this round already admitted (ceil-paged new tokens + a page + max_tokens);
  a request being chunked counts only its chunks until its last chunk, and a continuing chunk is
  cut to what the budget allows (the whole chunk if the budget is spent: it must make progress);
  in effect a running request reserves its prompt plus max_tokens, so this flavour never preempts;
- "batch is full": after a request fails the budget, admission is not attempted again until a
  running request has left the running batch. A request that finishes in a decode iteration is
  filtered out (and the flag cleared) only when the next decode iteration is formed, so one more
  decode runs before the next admission; one that finishes in a prefill iteration, or a chunk
  iteration, clears it at the next iteration;
- the policy's priority pass (LPM sort, or FCFS's waiting-prefix refresh every 32 passes) runs only
  on iterations that attempt admission;
- slots for a prefill batch are taken after the whole admission round (one eviction for the batch);
- with the radix cache disabled (E0a's cache-off cells; agentload's requests all ignore_eos),
  admission instead replays the running requests' future finishes (add_one_req_ignore_eos), which
  admits more than the reservation rule;
- mixed chunks (cell batching 'mixed', SGLang's --enable-mixed-chunk): the prefill round takes the
  budget left by one decode token per running request, and the decoders ride along in it.
"""

from __future__ import annotations

from harness.config import CellConfig
from harness.refengine.base import BaseEngine
from harness.refengine.kv import TokenKV
from harness.refengine.request import Req
from harness.refengine.scheduler import WaitingPolicy
from harness.refengine.separate import CLIP_MAX_NEW, ceil_page, insert_eos_state, replay_fits


class SGLangEngine(BaseEngine):
    """SGLang's scheduler over a reservation-gated token pool with a radix prefix cache."""

    kv: TokenKV

    def __init__(self, cell: CellConfig, *, seed: int = 0) -> None:
        super().__init__(cell, seed=seed)
        self.kv = TokenKV(cell.kv_pool_tokens, cell.page_size, cell.prefix_cache)
        # A chunk that stops short of a request's end is page-aligned (extend_len is cut to whole pages)
        self.page = cell.page_size
        self.mixed_chunks = cell.batching == "mixed"
        self.policy = WaitingPolicy(cell, self.kv, radix_flavour=True)
        self._batch_full = False  # SGLang's batch_is_full: admission waits for a request to leave
        self._unfiltered = 0  # finished in a decode iteration, still counted in the running batch
        self._merge_reset = False  # the last prefill iteration had a request leave (finish, or chunk)
        self._eos_states: list[tuple[int, int]] | None = None  # the ignore_eos replay's state within a round

    # -- the lifecycle hooks -------------------------------------------------------------------------
    def _check_length(self, n: int, max_tokens: int) -> None:
        ctx = self.context_length
        if n >= ctx:
            raise ValueError(f"prompt of {n} tokens exceeds the context length {ctx}")
        if n + max_tokens > ctx:
            super()._check_length(n, max_tokens)  # its error message

    def _prefilled(self, req: Req, upto: int) -> None:
        self.kv.checkpoint(req, upto)  # the computed prompt goes into the tree, locked by req

    def _iteration_done(self, kind: str, finished: int, chunking: bool) -> None:
        if kind == "prefill":
            self._merge_reset = self._merge_reset or bool(finished) or chunking
        else:
            self._unfiltered += finished

    # -- iteration planning ----------------------------------------------------------------------
    def _plan(self, now: float, horizon: float | None) -> float | None:
        if self.mixed_chunks:
            return self._plan_mixed(now, horizon)
        return self._plan_rounds(now, horizon)

    def _gen_now(self, req: Req) -> int:
        if req.state == "decode":
            return req.gen + (self.dstep - req.join)
        return req.gen

    def _decode_offset(self) -> int:
        """What the running batch will still decode (ignore_eos: the full max_tokens), each request
        clipped at CLIP_MAX_NEW; kept by the base as requests start and stop decoding."""
        return self.decode_left()

    def _allocatable(self, chunked: Req | None) -> int:
        running = len(self.running)
        running_bs = running - (1 if chunked is not None else 0) + self._unfiltered
        return min(self.max_running - running_bs, self.max_running - running)

    def _plan_rounds(self, now: float, horizon: float | None) -> float | None:
        if self._merge_reset:
            self._batch_full = False
            self._merge_reset = False
        if not self.running:
            # SGLang filters the finished requests in a pass that runs nothing and costs no time
            self._batch_full = False
            self._unfiltered = 0
        if self.prefilling or (self.waiting and not self._batch_full):  # an admission attempt
            # (none in most iterations of a healthy run: nothing waits, or the batch is full)
            chunked = self.prefilling[0] if self.prefilling else None
            if chunked is None and self._allocatable(None) <= 0:
                self._batch_full = True
            else:
                self.policy.calc_priority(self.waiting)
                items: list[tuple[Req, int]] = []
                tokens, pairs = self._prefill_round(chunked, items)
                if items:
                    self._pending = ("prefill", 0, items)
                    return now + self.cost.prefill_iteration(tokens, pairs, self._take_admitted())
        if self.n_decode:
            if self._unfiltered:
                self._unfiltered = 0
                self._batch_full = False
            return self._plan_decode(now, horizon)
        return None

    def _plan_mixed(self, now: float, horizon: float | None) -> float | None:
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
            self.kv.grow(R)
        self._pending = ("mixed", 1 if R else 0, items)
        return now + self.cost.mixed_iteration(tokens, pairs, R, float(self.ctx_sum), self._take_admitted())

    def _plan_decode(self, now: float, horizon: float | None) -> float:
        """Decode iterations over every decoding request, fused up to the next finish (or one, if
        the next iteration attempts admission) and to the driver's next event."""
        R = self.n_decode
        kmax = self._finish[0][0] - self.dstep if self._finish else 1
        if self.waiting and not self._batch_full:
            kmax = 1  # the next iteration attempts admission
        budget = 0.0 if horizon is None else horizon - now
        k, dur = self.cost.decode_run(R, self.ctx_sum, max(1, kmax), budget)
        self.kv.grow(k * R)
        self._pending = ("decode", k, [])
        return now + dur

    # -- admission -------------------------------------------------------------------------------
    def _prefill_round(
        self, chunked: Req | None, items: list[tuple[Req, int]], budget: int | None = None
    ) -> tuple[int, float]:
        kv = self.kv
        page = self.page
        if budget is None:
            budget = self.chunk
        offset = self._decode_offset()
        current = 0
        if chunked is not None:
            rem_total = kv.free_and_evictable() - offset
            avail = min(budget, rem_total)
            if avail <= 0:
                avail = budget  # a continuing chunk must make progress to release its KV
            left = chunked.target - chunked.done
            x = min(left, avail)
            if x < left:
                x = max(page, (x // page) * page) if page > 1 else x
            items.append((chunked, x))
            offset += ceil_page(x, page) + page + (min(chunked.max_tokens, CLIP_MAX_NEW) if x >= left else 0)
            current += ceil_page(x, page) + page
            budget -= x
        allocatable = self._allocatable(chunked)  # fixed for the round: nothing joins the batch until it runs
        waiting = self.waiting
        k = 0
        for req in waiting:
            if len(items) >= allocatable:
                self._batch_full = True
                break
            prefix = kv.match(req, True)
            x = req.target - prefix
            max_new = min(req.max_tokens - req.gen, CLIP_MAX_NEW)
            if kv.caching:
                fits = kv.fits(req, x + max_new + page + offset)  # x + max_new + page < pinned budget - offset
            else:
                base = kv.free_and_evictable()
                fits = self._fits_ignore_eos(req, x, items, base - current, base - offset)
            if not fits:
                self._batch_full = bool(items) or self.n_decode > 0 or self._unfiltered > 0
                break
            chunk = x
            if not kv.caching and x > budget:
                if budget <= 0:
                    break  # no chunk budget left this round
                chunk = budget  # the ignore_eos path cuts chunks at the remaining budget, unaligned
            elif ceil_page(x, page) > budget:
                end = ((prefix + (budget // page) * page) // page) * page
                chunk = end - prefix
                if chunk <= 0:
                    break
            kv.admit(req, prefix)
            self._start_prefill(req, prefix)
            items.append((req, chunk))
            offset += ceil_page(chunk, page) + page + (max_new if chunk == x else 0)
            current += ceil_page(chunk, page) + page
            budget -= chunk
            k += 1
            base = kv.free_and_evictable()
            if base - offset <= 0 or base - current <= 0:
                self._batch_full = True
                break
            if budget <= 0 or chunk < x:
                break
        if k:
            del waiting[:k]
        self._eos_states = None
        # slots for the whole batch at once (prepare_for_extend), then the chunks are placed
        tokens = 0
        pairs = 0.0
        for req, x in items:
            pairs += x * (req.done + (x + 1) / 2.0)
            req.done += x
            tokens += x
        if items:
            kv.alloc(items[0][0], tokens)
        return tokens, pairs

    def _fits_ignore_eos(
        self, req: Req, x: int, items: list[tuple[Req, int]], remaining_current: int, remaining_total: int
    ) -> bool:
        """PrefillAdder.add_one_req_ignore_eos (radix cache disabled, every request ignore_eos):
        the new chunk must fit now, and replaying the future must never run the pool below one
        token per running request (separate.replay_fits). The replay's states are built at the
        round's first candidate and kept for the rest of the round."""
        paged = ceil_page(x, self.page) + self.page
        if paged > min(remaining_current, remaining_total):
            return False
        states = self._eos_states
        cand = (req.max_tokens - req.gen, req.L + req.gen)
        if states is None:
            states = [cand] if cand[0] > 0 else []
            for r in self.running.values():
                if r.state == "decode" and (left := r.max_tokens - self._gen_now(r)) > 0:
                    states.append((left, r.L + self._gen_now(r)))
            for r, _x in items:
                if (left := r.max_tokens - r.gen) > 0:
                    states.append((left, r.L + r.gen))
            states.sort(key=lambda t: t[0])
        elif cand[0] > 0:
            insert_eos_state(states, cand)
        self._eos_states = states
        return replay_fits(states, remaining_current - paged)
