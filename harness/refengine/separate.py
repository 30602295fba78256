"""SGLang's scheduler loop for the radix flavour: separate prefill and decode iterations.

A mixin of EngineModel, kept apart because it follows one engine's code closely (SGLang 0.5.22,
Scheduler.get_next_batch_to_run / get_new_batch_prefill / update_running_batch, PrefillAdder and
PrefillBudget; checked decision by decision against that code by sim2real/):

- prefill first: an iteration prefills whenever a prefill batch can be formed (the request being
  chunked continues first, then waiting requests are admitted in queue order), otherwise every
  decoding request decodes one token;
- admission budget: a request is admitted only if its new tokens + max_tokens + one page are
  *below* free + evictable slots (its own matched prefix pinned) less what running requests will
  still decode and what this round already admitted (ceil-paged new tokens + a page + max_tokens);
  a request being chunked counts only its chunks until its last chunk, and a continuing chunk is
  cut to what the budget allows (the whole chunk if the budget is spent: it must make progress);
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
  admits more than the reservation rule.
"""

from __future__ import annotations

from harness.refengine.request import Req

CLIP_MAX_NEW = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the decode reservation per request is capped
IGNORE_EOS_RESERVE = 1  # IGNORE_EOS_RESERVE_TOKENS: slack per running request in the ignore_eos replay


class SeparateBatching:
    # state shared with EngineModel (declared there): running, waiting, prefilling, kv, policy,
    # chunk, page, max_running, n_decode, dstep, counters, _batch_full, _pending
    _unfiltered: int  # finished in a decode iteration, still counted in the running batch
    _merge_reset: bool  # the last prefill iteration had a request leave (finish, or chunk)
    _eos_states: list[tuple[int, int]] | None = None  # the ignore_eos replay's state within a round

    def _ceil_page(self, n: int) -> int:
        p = self.page  # type: ignore[attr-defined]
        return -(-n // p) * p

    def _gen_now(self, req: Req) -> int:
        if req.state == "decode":
            return req.gen + (self.dstep - req.join)  # type: ignore[attr-defined]
        return req.gen

    def _decode_offset(self) -> int:
        """What the running batch will still decode (ignore_eos: the full max_tokens), each request
        clipped at CLIP_MAX_NEW; kept by EngineModel as requests start and stop decoding."""
        return self.decode_left()  # type: ignore[attr-defined]

    def _allocatable(self, chunked: Req | None) -> int:
        running = len(self.running)  # type: ignore[attr-defined]
        running_bs = running - (1 if chunked is not None else 0) + self._unfiltered
        return min(self.max_running - running_bs, self.max_running - running)  # type: ignore[attr-defined]

    def _plan_radix(self, now: float, horizon: float | None) -> float | None:
        if self._merge_reset:
            self._batch_full = False
            self._merge_reset = False
        if not self.running:  # type: ignore[attr-defined]
            # SGLang filters the finished requests in a pass that runs nothing and costs no time
            self._batch_full = False
            self._unfiltered = 0
        chunked = self.prefilling[0] if self.prefilling else None  # type: ignore[attr-defined]
        items: list[tuple[Req, int]] = []
        tokens = 0
        pairs = 0.0
        attempt = chunked is not None or (self.waiting and not self._batch_full)  # type: ignore[attr-defined]
        if attempt and chunked is None and self._allocatable(None) <= 0:
            self._batch_full = True
            attempt = False
        if attempt:
            self.policy.calc_priority(self.waiting)  # type: ignore[attr-defined]
            tokens, pairs = self._prefill_round(chunked, items)
        if items:
            self._pending = ("prefill", 0, items)
            return now + self.cost.prefill_iteration(tokens, pairs)  # type: ignore[attr-defined]
        if self.n_decode:  # type: ignore[attr-defined]
            if self._unfiltered:
                self._unfiltered = 0
                self._batch_full = False
            return self._plan_decode(now, horizon)  # type: ignore[attr-defined]
        return None

    def _prefill_round(
        self, chunked: Req | None, items: list[tuple[Req, int]], budget: int | None = None
    ) -> tuple[int, float]:
        kv = self.kv  # type: ignore[attr-defined]
        page = self.page  # type: ignore[attr-defined]
        if budget is None:
            budget = self.chunk  # type: ignore[attr-defined]
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
            offset += self._ceil_page(x) + page + (min(chunked.max_tokens, CLIP_MAX_NEW) if x >= left else 0)
            current += self._ceil_page(x) + page
            budget -= x
        allocatable = self._allocatable(chunked)  # fixed for the round: nothing joins the batch until it runs
        waiting = self.waiting  # type: ignore[attr-defined]
        k = 0
        for req in waiting:
            if len(items) >= allocatable:
                self._batch_full = True
                break
            prefix = kv.match(req, True)
            x = req.target - prefix
            max_new = min(req.max_tokens - req.gen, CLIP_MAX_NEW)
            if kv.caching:
                fits = x + max_new + page < kv.free_and_evictable(req) - offset
            else:
                base = kv.free_and_evictable()
                fits = self._fits_ignore_eos(req, x, items, base - current, base - offset)
            if not fits:
                self._batch_full = bool(items) or self.n_decode > 0 or self._unfiltered > 0  # type: ignore[attr-defined]
                break
            chunk = x
            if not kv.caching and x > budget:
                if budget <= 0:
                    break  # no chunk budget left this round
                chunk = budget  # the ignore_eos path cuts chunks at the remaining budget, unaligned
            elif self._ceil_page(x) > budget:
                end = ((prefix + (budget // page) * page) // page) * page
                chunk = end - prefix
                if chunk <= 0:
                    break
            kv.admit(req, prefix)
            req.prefix = prefix
            req.done = prefix
            req.state = "prefill"
            if req.cached < 0:
                req.cached = prefix
                req.admitted = self._now  # type: ignore[attr-defined]
                self.counters["prompt"] += req.L  # type: ignore[attr-defined]
                self.counters["cached"] += prefix  # type: ignore[attr-defined]
            self.running[req.rid] = req  # type: ignore[attr-defined]
            self.prefilling.append(req)  # type: ignore[attr-defined]
            items.append((req, chunk))
            offset += self._ceil_page(chunk) + page + (max_new if chunk == x else 0)
            current += self._ceil_page(chunk) + page
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
        total = sum(x for _r, x in items)
        if items:
            kv.alloc(items[0][0], total)
        tokens = 0
        pairs = 0.0
        for req, x in items:
            pairs += x * (req.done + (x + 1) / 2.0)
            req.done += x
            tokens += x
        return tokens, pairs

    def _fits_ignore_eos(
        self, req: Req, x: int, items: list[tuple[Req, int]], remaining_current: int, remaining_total: int
    ) -> bool:
        """PrefillAdder.add_one_req_ignore_eos (radix cache disabled, every request ignore_eos):
        the new chunk must fit now, and replaying the future -- requests finish in order of the
        tokens they still have to decode, each then freeing what it holds now -- must never run the
        pool below one token per running request."""
        page = self.page  # type: ignore[attr-defined]
        paged = self._ceil_page(x) + page
        if paged > min(remaining_current, remaining_total):
            return False
        states = self._eos_states
        cand = (req.max_tokens - req.gen, req.L + req.gen)
        if states is None:
            states = [cand] if cand[0] > 0 else []
            for r in self.running.values():  # type: ignore[attr-defined]
                if r.state == "decode" and (left := r.max_tokens - self._gen_now(r)) > 0:
                    states.append((left, r.L + self._gen_now(r)))
            for r, _x in items:
                if (left := r.max_tokens - r.gen) > 0:
                    states.append((left, r.L + r.gen))
            states.sort(key=lambda t: t[0])
        elif cand[0] > 0:
            i = 0
            for i in range(len(states)):  # SGLang's insertion: before the first with as much left
                if cand[0] <= states[i][0]:
                    break
            states.insert(i, cand)
        self._eos_states = states
        cur = remaining_current - paged
        freed = 0
        n = len(states)
        for i, (left, occupied) in enumerate(states):
            bs = n - i
            if cur + freed - left * bs <= IGNORE_EOS_RESERVE * bs:
                return False
            freed += occupied
        return True
