"""Waiting-queue policy of the engine model: admission order, LPM and the waiting-prefix refresh.

Request-level FCFS with head-of-line blocking: the queue is scanned in order and the scan stops
at the first request that does not fit (memory or running-request limit), so a small request
never overtakes a large one. SGLang flavour details (paper App. E.2, E.8, E.14):
- LPM sorts the queue by cached-prefix length (stably, so ties stay FCFS), matching every waiting
  request each pass -- and touching its prefix; while more than `lpm_fallback_waiting` requests
  wait it does not sort (the order left by the last sort stays);
- the waiting-prefix refresh touches the cached prefixes of the first 128 waiting requests every
  32 scheduling passes, under FCFS and under LPM while it has fallen back;
- after a request fails to fit, admission is not retried until a running request finishes
  (SGLang's `batch_is_full`), since nothing else can make room.
"""

from __future__ import annotations

from harness.config import CellConfig
from harness.refengine.request import Req

REFRESH_EVERY = 32  # scheduling passes between waiting-prefix refreshes
REFRESH_HEAD = 128  # waiting requests whose prefixes a refresh touches


class WaitingPolicy:
    def __init__(self, cell: CellConfig, kv: object, radix_flavour: bool) -> None:
        self.kv = kv
        self.lpm = cell.schedule_policy == "lpm" and cell.prefix_cache
        self.fallback = cell.lpm_fallback_waiting
        self.refresh = bool(cell.waiting_prefix_refresh and radix_flavour and cell.prefix_cache)
        self.passes = 0

    def lpm_active(self, waiting: list[Req]) -> bool:
        return self.lpm and len(waiting) <= self.fallback

    def refresh_due_in(self, waiting: list[Req]) -> int | None:
        """How many iterations, starting with the current pass, can run before the next refresh
        pass (None if no refresh can happen while the queue stays as it is)."""
        if not self.refresh or not waiting or self.lpm_active(waiting):
            return None
        return REFRESH_EVERY - (self.passes % REFRESH_EVERY)

    def on_pass(self, waiting: list[Req]) -> None:
        """One scheduling pass: the periodic refresh, if this pass is due."""
        self.passes += 1
        if self.refresh and waiting and self.passes % REFRESH_EVERY == 0 and not self.lpm_active(waiting):
            touch = self.kv.touch  # type: ignore[attr-defined]
            for req in waiting[:REFRESH_HEAD]:
                touch(req)

    def order(self, waiting: list[Req]) -> None:
        """Sort the queue in place for LPM (SGLang keeps the sorted order between passes)."""
        if not self.lpm_active(waiting):
            return
        match = self.kv.match  # type: ignore[attr-defined]
        keyed = [(-match(req, True), i, req) for i, req in enumerate(waiting)]
        keyed.sort(key=lambda t: (t[0], t[1]))
        waiting[:] = [t[2] for t in keyed]
