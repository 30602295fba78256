"""What both engine flavours share: the request lifecycle, the decode bookkeeping and the public API.

An engine model is driven the same way whatever engine it stands for: requests go in with
`submit`; the driver asks for the next iteration with `step(now, horizon)`, waits (virtually or
really) until the returned end time and applies it with `complete(end)`. Nothing here reads a
clock, sleeps or does I/O, so the same model runs in the discrete-event simulator and behind the
HTTP emulator.

The flavours (harness/refengine/sglang.py, vllm.py) differ in how they plan an iteration (which
requests prefill how much, who decodes, who is preempted) and in their KV memory; what an
iteration does to a request once planned is the same for both and lives here: a prefill chunk
that completes the prompt produces a token and starts a decode stint; a decode stint's tokens are
counted from a global decode-step counter, so a decode iteration costs O(1), not O(running); a
request that has produced max_tokens finishes and its KV goes back to the flavour's memory.
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

from harness.config import CellConfig
from harness.refengine.request import EngineCompletion, EngineRequest, Req

CLIP_MAX_NEW = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the decode reservation per request is capped


class KVMemory(Protocol):
    """What the shared lifecycle asks of a flavour's KV memory (harness/refengine/kv.py)."""

    M: int

    def finish(self, req: Req) -> None: ...
    def flush(self) -> None: ...
    def used_running(self) -> int: ...
    def evictable(self) -> int: ...


#: an iteration in progress: (kind, decode steps it covers, prefill chunks as (request, tokens))
Pending = tuple[str, int, list[tuple[Req, int]]]


class BaseEngine:
    """The shared state and API of the engine model; a flavour plans the iterations (`_plan`).

    Build one with `harness.refengine.model.EngineModel(cell, seed=...)`, which picks the flavour
    the cell's engine names."""

    kv: KVMemory

    def __init__(self, cell: CellConfig, *, seed: int = 0) -> None:
        self.cell = cell
        self.cost = cell.cost.model()
        self.seed = seed
        self.chunk = cell.chunked_prefill
        self.max_running = cell.max_running
        self.context_length = cell.context_length
        self.waiting: list[Req] = []
        self.running: dict[int, Req] = {}  # admission order (the preemption order is its reverse)
        self.prefilling: list[Req] = []  # admitted, prefill not complete (admission order)
        self.n_decode = 0
        self.ctx_sum = 0  # summed context of decoding requests (drives decode attention cost)
        # What the decoding requests will still decode, kept as it changes so SGLang's admission
        # budget (sglang.py: _decode_offset) costs O(1), not O(running), per prefill round: a
        # request decodes max_tokens - gen - (dstep - join) more tokens, so the sum over decoders
        # with at most CLIP_MAX_NEW left at their join is _left_sum - _left_n * dstep; the few
        # that start above the clip are summed one by one (_left_big).
        self._left_sum = 0
        self._left_n = 0
        self._left_big: dict[int, Req] = {}
        self.dstep = 0  # decode iterations so far; a decoding request's count derives from it
        self._finish: list[tuple[int, int, int, Req]] = []  # (dstep at which done, seq, stint, req)
        self._batch_full = False
        self._pending: Pending | None = None
        self._now = 0.0  # start of the iteration being planned (admission times)
        self._seq = 0
        self._ids: set[int] = set()
        self.counters = {"prompt": 0, "cached": 0, "generated": 0, "preemptions": 0}
        # requests admitted for the first time while the iteration being planned was formed: each pays
        # the cost model's per-request term c_r once (a recompute after preemption does not)
        self.admitted = 0

    # -- what a flavour provides -------------------------------------------------------------------
    def _plan(self, now: float, horizon: float | None) -> float | None:
        """Plan the next iteration (set `_pending`); its end time, or None if nothing can run."""
        raise NotImplementedError

    def _check_length(self, n: int, max_tokens: int) -> None:
        """Refuse a request whose length the engine refuses (prompt of n tokens)."""
        ctx = self.context_length
        if n + max_tokens > ctx:
            raise ValueError(f"prompt of {n} tokens plus max_tokens {max_tokens} exceeds the context length {ctx}")

    def _prefilled(self, req: Req, upto: int) -> None:
        """`req`'s first `upto` tokens are computed (a chunk ended, or its prompt did)."""

    def _iteration_done(self, kind: str, finished: int, chunking: bool) -> None:
        """The iteration in progress was applied: `finished` requests left, `chunking`: one of
        its prefills is not complete yet."""

    # -- public API ------------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> None:
        """Queue a request. Raises ValueError for requests the engine would refuse (HTTP 400)."""
        n = len(req.prompt)
        if n < 1:
            raise ValueError("prompt: got 0 tokens; expected at least 1")
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        self._check_length(n, req.max_tokens)
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
        return self._plan(now, horizon)

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
                    self._prefilled(req, req.done)
        self._iteration_done(kind, len(out), chunking)
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

    def decode_left(self) -> int:
        """Tokens the decoding requests will still decode, each counted at most CLIP_MAX_NEW (the
        decode reservation of SGLang's admission budget)."""
        tot = self._left_sum - self._left_n * self.dstep
        for req in self._left_big.values():
            tot += min(req.max_tokens - req.gen - (self.dstep - req.join), CLIP_MAX_NEW)
        return tot

    def _take_admitted(self) -> int:
        """The first admissions of the iteration being planned (then 0 for the next): what its cost's
        per-request term is charged for."""
        k = self.admitted
        self.admitted = 0
        return k

    # -- state transitions -----------------------------------------------------------------------
    def _start_prefill(self, req: Req, prefix: int) -> None:
        """`req` is admitted with `prefix` tokens cached: it runs, its prefill starts there."""
        req.prefix = prefix
        req.done = prefix
        req.state = "prefill"
        if req.cached < 0:
            req.cached = prefix
            req.admitted = self._now
            self.admitted += 1
            self.counters["prompt"] += req.L
            self.counters["cached"] += prefix
        self.running[req.rid] = req
        self.prefilling.append(req)

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
        self._prefilled(req, req.target)
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

    def _finish_req(self, req: Req, now: float, out: list[EngineCompletion]) -> None:
        self._left_leave(req)
        self.n_decode -= 1
        self.ctx_sum -= req.L + req.max_tokens
        req.state = "done"
        self.kv.finish(req)
        del self.running[req.rid]
        self._ids.discard(req.rid)
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
