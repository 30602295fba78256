"""Our engine model stepped one iteration at a time, reporting the same per-step decisions as the
engine drivers (batch, admissions with their cached prefixes, preemptions, evictions, finishes).

The model is used as it runs in the simulator; the only additions are observers: a subclass that
logs the order of preemptions, and a wrapper on the block pool's allocation that records which
cached blocks the allocation evicts. Time is the step index (costs play no part in decisions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.config import CellConfig
from harness.refengine.kv import BlockKV, TokenKV
from harness.refengine.model import EngineModel
from harness.refengine.request import EngineRequest, Req, output_ids
from harness.refengine.vllm import VLLMEngine
from sim2real.digest import chain_digests
from sim2real.traces import EngineShape


def vllm_cell(shape: EngineShape, *, prefix_cache: bool = True) -> CellConfig:
    """The cell our model needs to behave as vLLM built with `shape` (pool = blocks x block size,
    as --num-gpu-blocks-override gives it)."""
    return CellConfig(
        name="sim2real-vllm",
        engine={"name": "vllm", "version": "0.32.0"},
        model="fake",
        gpu="none",
        kv_pool_tokens=shape.pool_tokens,
        page_size=shape.block_size,
        schedule_policy="fcfs",
        chunked_prefill=shape.max_num_batched_tokens,
        max_running=shape.max_num_seqs,
        prefix_cache=prefix_cache,
        waiting_prefix_refresh=False,
        batching="mixed",
        context_length=shape.max_model_len,
    )


class _Observed(VLLMEngine):
    """The vLLM-flavour engine model, logging preemptions in the order they happen."""

    def __init__(self, cell: CellConfig, seed: int) -> None:
        super().__init__(cell, seed=seed)
        self.preempt_log: list[int] = []

    def _preempt_last(self) -> Req:
        req = super()._preempt_last()
        self.preempt_log.append(req.rid)
        return req


class OurEngine:
    """The vLLM-flavour engine model behind the drivers' request/reply messages (ids are strings, as in vLLM)."""

    def __init__(self, cell: CellConfig, *, seed: int = 0) -> None:
        self.model = _Observed(cell, seed)
        self.seed = seed
        self.now = 0.0
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._key_digest: dict[int, str] = {}
        self.evicted: list[str] = []
        kv = self.model.kv
        if not isinstance(kv, BlockKV):
            raise ValueError("OurEngine drives the block (vLLM) flavour; use the radix stepper for SGLang")
        self.kv = kv
        pool = kv.pool

        def observe(n: int) -> None:
            for b in pool.peek_free(n):
                h = pool.block_hash(b)
                if h is not None and pool.lookup([h], 1) == [b]:
                    self.evicted.append(self._key_digest.get(h, "?"))

        # Every block the pool hands out leaves through one of two leaves: a few at a time (a
        # decode step's block, also taken directly by fused decode) or as an array (a prefill
        # chunk's, BlockKV.alloc; `allocate` of many goes through it too). Observing `allocate`
        # alone missed every chunk's evictions once chunks took the array path.
        few, array = pool._allocate_few, pool.allocate_array

        def observed_few(n: int) -> list[int]:
            observe(n)
            return few(n)

        def observed_array(n: int) -> np.ndarray:
            observe(n)
            return array(n)

        pool._allocate_few = observed_few  # type: ignore[method-assign]
        pool.allocate_array = observed_array  # type: ignore[method-assign]

    def outputs(self, prompt: list[int], max_tokens: int) -> list[int]:
        """The ids our model will return for this request (the fake model's outputs on both sides)."""
        return [int(x) for x in output_ids(np.asarray(prompt, dtype=np.int32), max_tokens, self.seed)]

    def add(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        n = len(self._ids) + 1
        self._ids[rid] = n
        self._names[n] = rid
        tokens = list(prompt) + self.outputs(prompt, max_tokens)
        B = self.kv.B
        nb = len(tokens) // B
        keys = self.kv.pool.hasher.keys(np.asarray(tokens, dtype=np.int32), nb)
        for k, d in zip(keys, chain_digests(tokens, B)):
            self._key_digest.setdefault(k, d)
        self.model.submit(
            EngineRequest(req_id=n, prompt=np.asarray(prompt, dtype=np.int32), max_tokens=max_tokens), self.now
        )

    def step(self) -> dict[str, Any]:
        m = self.model
        self.evicted = []
        m.preempt_log = []
        waiting_before = {r.rid for r in m.waiting}
        end = m.step(self.now)
        batch: list[list[Any]] = []
        new: list[list[Any]] = []
        resumed: list[list[Any]] = []
        finished: list[str] = []
        if end is not None:
            _kind, k, items = m._pending  # type: ignore[misc]
            chunks = {req.rid: x for req, x in items}
            for rid, req in m.running.items():
                if rid in chunks:
                    batch.append([self._names[rid], int(chunks[rid])])
                elif k and req.state == "decode":
                    batch.append([self._names[rid], 1])
            for req, _x in items:
                if req.rid in waiting_before:
                    (resumed if req.preemptions else new).append([self._names[req.rid], int(req.prefix)])
            self.now = max(end, self.now + 1.0)
            finished = [self._names[c.req_id] for c in m.complete(self.now)]
        else:
            self.now += 1.0
        return {
            "batch": batch,
            "new": new,
            "resumed": resumed,
            "preempted": [self._names[r] for r in m.preempt_log],
            "finished": finished,
            "evicted": list(self.evicted),
            "free_blocks": self.kv.pool.free_count(),
            "waiting": len(m.waiting),
            "running": len(m.running),
        }

    def flush(self) -> bool:
        return self.model.flush_cache()


def sglang_cell(shape: EngineShape, *, prefix_cache: bool = True, policy: str = "fcfs") -> CellConfig:
    """The cell our model needs to behave as SGLang built with `shape` (page size 1: one token
    per page, the SGLang default; pool = blocks x block size tokens)."""
    return CellConfig(
        name="sim2real-sglang",
        engine={"name": "sglang", "version": "0.5.22"},
        model="fake",
        gpu="none",
        kv_pool_tokens=shape.pool_tokens,
        page_size=1,
        schedule_policy=policy,
        chunked_prefill=shape.max_num_batched_tokens,
        max_running=shape.max_num_seqs,
        prefix_cache=prefix_cache,
        waiting_prefix_refresh=True,
        batching="separate",
        context_length=shape.max_model_len,
    )


class OurRadixEngine:
    """The SGLang-flavour engine model (radix cache, reservations, separate prefill and decode
    iterations) behind the drivers' request/reply messages."""

    def __init__(self, cell: CellConfig, *, seed: int = 0) -> None:
        self.model = EngineModel(cell, seed=seed)
        if not isinstance(self.model.kv, TokenKV):
            raise ValueError("OurRadixEngine drives the radix (SGLang) flavour")
        self.kv = self.model.kv
        self.seed = seed
        self.now = 0.0
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self.evicted = 0
        tree = self.kv.tree
        evict = tree.evict

        def counted(tokens: int) -> int:
            n = evict(tokens)
            self.evicted += n
            return n

        tree.evict = counted  # type: ignore[method-assign]

    def outputs(self, prompt: list[int], max_tokens: int) -> list[int]:
        return [int(x) for x in output_ids(np.asarray(prompt, dtype=np.int32), max_tokens, self.seed)]

    def add(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        n = len(self._ids) + 1
        self._ids[rid] = n
        self._names[n] = rid
        self.model.submit(
            EngineRequest(req_id=n, prompt=np.asarray(prompt, dtype=np.int32), max_tokens=max_tokens), self.now
        )

    def step(self) -> dict[str, Any]:
        m = self.model
        self.evicted = 0
        waiting_before = {r.rid for r in m.waiting}
        end = m.step(self.now)
        out: dict[str, Any] = {"kind": "idle", "batch": [], "new": [], "resumed": [], "preempted": [], "finished": []}
        if end is not None:
            kind, _k, items = m._pending  # type: ignore[misc]
            if kind == "prefill":
                out["kind"] = "prefill"
                out["batch"] = [[self._names[r.rid], int(x)] for r, x in items]
                for r, _x in items:
                    if r.rid in waiting_before:
                        out["resumed" if r.preemptions else "new"].append([self._names[r.rid], int(r.prefix)])
            else:
                out["kind"] = "decode"
                out["batch"] = [[self._names[rid], 1] for rid, r in m.running.items() if r.state == "decode"]
            self.now = max(end, self.now + 1.0)
            out["finished"] = [self._names[c.req_id] for c in m.complete(self.now)]
        else:
            self.now += 1.0
        kv = self.kv
        out.update(
            {
                "evicted_tokens": self.evicted,
                "available": kv.M - kv.own - kv.tree.total,
                "evictable": kv.tree.evictable,
                "protected": kv.tree.protected,
                "waiting": len(m.waiting),
                "running": len(m.running),
            }
        )
        return out

    def flush(self) -> bool:
        return self.model.flush_cache()
