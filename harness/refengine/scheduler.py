"""Waiting-queue policy of the engine model: admission order, LPM and the waiting-prefix refresh.

Request-level FCFS with head-of-line blocking: the queue is scanned in order and the scan stops
at the first request that does not fit (memory or running-request limit), so a small request
never overtakes a large one. SGLang flavour details (paper App. E.2, E.8, E.14):
- LPM sorts the queue by cached-prefix length (stably, so ties stay FCFS), matching every waiting
  request each pass -- and touching its prefix; while more than `lpm_fallback_waiting` requests
  wait it does not sort (the order left by the last sort stays);
- the waiting-prefix refresh touches the cached prefixes of the first 128 waiting requests (the
  head last) on the first and then every 32nd priority pass, under FCFS and under LPM while it
  has fallen back; a priority pass happens only when admission is attempted (SGLang skips it
  while its batch is full);
- after a request fails to fit, admission is not retried until a running request leaves
  (SGLang's `batch_is_full`; see separate.py for when exactly), since nothing else can make room.
"""

from __future__ import annotations

from typing import Protocol

from harness.config import CellConfig
from harness.refengine.request import Req

REFRESH_EVERY = 32  # scheduling passes between waiting-prefix refreshes
REFRESH_HEAD = 128  # waiting requests whose prefixes a refresh touches


class PrefixLookup(Protocol):
    """What the policy asks of the KV memory (TokenKV): a waiting request's cached prefix."""

    def match(self, req: Req, touch: bool = True) -> int: ...
    def touch(self, req: Req) -> None: ...


class WaitingPolicy:
    def __init__(self, cell: CellConfig, kv: PrefixLookup, radix_flavour: bool) -> None:
        self.kv = kv
        self.lpm = cell.schedule_policy == "lpm" and cell.prefix_cache
        self.fallback = cell.lpm_fallback_waiting
        self.refresh = bool(cell.waiting_prefix_refresh and radix_flavour and cell.prefix_cache)
        self.passes = 0  # priority passes run while FCFS is the active order (the refresh counter)

    def lpm_active(self, waiting: list[Req]) -> bool:
        return self.lpm and len(waiting) <= self.fallback

    def calc_priority(self, waiting: list[Req]) -> None:
        """SchedulePolicy.calc_priority: called once per admission attempt. LPM (while active)
        re-sorts the queue by cached prefix, matching -- and touching -- every waiting request;
        otherwise the order stays and, every REFRESH_EVERY-th pass starting with the first, the
        prefixes of the first REFRESH_HEAD waiting requests are touched, the head last (so LRU
        would evict the queue's prefixes in reverse admission order)."""
        if self.lpm_active(waiting):
            self.order(waiting)
            return
        if not self.refresh or not waiting:
            return
        due = self.passes % REFRESH_EVERY == 0
        self.passes += 1
        if due:
            touch = self.kv.touch
            for req in reversed(waiting[:REFRESH_HEAD]):
                touch(req)

    def order(self, waiting: list[Req]) -> None:
        """Sort the queue in place for LPM (SGLang keeps the sorted order between passes)."""
        if not self.lpm_active(waiting):
            return
        match = self.kv.match
        keyed = [(-match(req, True), i, req) for i, req in enumerate(waiting)]
        keyed.sort(key=lambda t: (t[0], t[1]))
        waiting[:] = [t[2] for t in keyed]
