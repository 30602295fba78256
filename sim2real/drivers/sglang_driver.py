"""SGLang 0.5.22's own scheduling classes, driven one scheduler iteration at a time over JSON lines.

Runs INSIDE the SGLang engine venv (it imports sglang; the harness never does), with
SGLANG_USE_CPU_ENGINE=1. The decisions are SGLang's own code: the radix cache the server builds
(UnifiedRadixCache with the tree core the server picks), the token allocator and request-slot
pool, SchedulePolicy.calc_priority (FCFS / LPM, the 128-request fallback, the waiting-prefix
refresh), PrefillAdder (admission, its memory budget, chunking), ScheduleBatch (prefill and decode
allocation, eviction, filtering, merging, decode memory checks and retraction), and the cache
calls of a finished or chunked request (release_kv_cache, checkpoint_kv_cache). The loop that
calls them is a port of Scheduler.get_next_batch_to_run / get_new_batch_prefill /
update_running_batch / process_batch_result for the configuration the experiments use (separate
prefill and decode batches, no overlap, no speculative decoding, no hierarchical cache); the model
forward is replaced by the caller's output ids, as SGLang's own scheduler tests use mock models.

Messages (request -> reply), as the vLLM driver's:
  {"op": "init", "model": DIR, "pool_tokens": M, "page_size": P, "chunked_prefill": C,
   "max_running": R, "schedule_policy": "fcfs"|"lpm", "context_length": L, "prefix_caching": true}
  {"op": "add", "id": .., "prompt": [..], "max_tokens": d, "output": [..]}
  {"op": "step"} -> {"kind": "prefill"|"decode"|"idle", "batch": [[id, tokens], ...],
                     "new": [[id, cached], ...], "resumed": [[id, cached], ...],
                     "preempted": [id, ...], "finished": [id, ...], "evicted_tokens": n,
                     "available": n, "evictable": n, "protected": n, "waiting": n, "running": n}
  {"op": "flush"} -> {"ok": bool}      {"op": "quit"}
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from array import array
from typing import Any

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Driver:
    def init(self, msg: dict[str, Any]) -> dict[str, Any]:
        import sglang
        import torch
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.M = int(msg["pool_tokens"])
        self.P = int(msg.get("page_size", 1))
        self.C = int(msg["chunked_prefill"])
        self.R = int(msg["max_running"])
        L = int(msg["context_length"])
        caching = bool(msg.get("prefix_caching", True))
        sa = ServerArgs(
            model_path=msg["model"],
            device="cpu",
            max_total_tokens=self.M,
            page_size=self.P,
            chunked_prefill_size=self.C,
            max_running_requests=self.R,
            schedule_policy=msg.get("schedule_policy", "fcfs"),
            context_length=L,
            disable_radix_cache=not caching,
            skip_tokenizer_init=True,
        )
        publish(sa, role="scheduler")
        self.server_args = sa
        self.model_config = ModelConfig.from_server_args(sa)
        self.req_to_token_pool = ReqToTokenPool(
            size=self.R, max_context_len=L + 4, device="cpu", enable_memory_saver=False
        )
        if self.P == 1:
            self.allocator = TokenToKVPoolAllocator(self.M, torch.float16, "cpu", None, False)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(self.M, self.P, torch.float16, "cpu", None, False)
        params = CacheInitParams(
            disable=not caching,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.P,
            tree_components=(ComponentType.FULL,),
            eviction_policy=sa.radix_eviction_policy,
            chunked_prefill_size=self.C,
        )
        self.tree = UnifiedRadixCache(params)
        self.policy = SchedulePolicy(sa.schedule_policy, self.tree, False, False, False)
        self.max_prefill_tokens = sa.max_prefill_tokens
        self.ScheduleBatch = ScheduleBatch
        self.spec = SpeculativeAlgorithm.NONE
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.waiting: list[Any] = []
        self.chunked_req: Any = None
        self.last_batch: Any = None
        self.outputs: dict[str, list[int]] = {}
        self.admitted_once: set[str] = set()
        self.live: set[str] = set()  # admitted, not finished, not retracted
        self.evicted = 0
        tree = self.tree
        orig = tree._evict
        drv = self

        def counted_evict(*a: Any, **kw: Any) -> Any:
            res = orig(*a, **kw)
            drv.evicted += int(res.num_tokens_evicted)
            return res

        tree._evict = counted_evict
        return {
            "ok": True,
            "version": sglang.__version__,
            "tree_core": type(tree.tree_core).__name__,
            "max_prefill_tokens": self.max_prefill_tokens,
            "fast_match": bool(tree.supports_fast_match_prefix()),
        }

    # -- requests ---------------------------------------------------------------------------------
    def add(self, msg: dict[str, Any]) -> dict[str, Any]:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        rid = str(msg["id"])
        sp = SamplingParams(max_new_tokens=int(msg["max_tokens"]), ignore_eos=True, temperature=0.0)
        sp.normalize(None)
        req = Req(rid, "", array("q", msg["prompt"]), sp)
        self.outputs[rid] = list(msg["output"])
        self.waiting.append(req)
        return {"ok": True}

    # -- one scheduler iteration -------------------------------------------------------------------
    def _new_prefill_batch(self) -> Any:
        """Scheduler._get_new_batch_prefill_raw for FCFS/LPM, no LoRA, no hierarchical cache."""
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

        rb = self.running
        if rb.is_empty():
            rb.batch_is_full = False
        if (rb.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = len(rb.reqs)
        if self._allocatable(running_bs) <= 0 and self.chunked_req is None:
            rb.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting, rb)
        adder = PrefillAdder(
            self.P,
            self.tree,
            self.allocator,
            rb,
            1.0,
            self.max_prefill_tokens,
            self.C,
            0,
            0,
            max_running_requests=self.R,
            waiting_queue_len=len(self.waiting),
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            running_bs = len(rb.reqs)
            if len(adder.can_run_list) >= self._allocatable(running_bs):
                rb.batch_is_full = True
            if rb.batch_is_full:
                break
            req.init_next_round_input(self.tree)
            res = adder.add_one_req(req, has_chunked_req=(self.chunked_req is not None), truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    rb.batch_is_full = len(adder.can_run_list) > 0 or (not rb.is_empty())
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        cset = set(can_run)
        self.waiting = [x for x in self.waiting if x not in cset]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = self.ScheduleBatch.init_new(
            can_run,
            self.req_to_token_pool,
            self.allocator,
            self.tree,
            self.model_config,
            False,
            self.spec,
            chunked_req=self.chunked_req,
        )
        batch.contains_last_prefill_chunk = self.chunked_req is None or len(can_run) != 1
        batch.prepare_for_extend()
        return batch

    def _allocatable(self, running_bs: int) -> int:
        return min(self.R - running_bs, self.req_to_token_pool.available_size())

    def _update_running(self) -> tuple[Any, list[Any]]:
        """Scheduler.update_running_batch: filter finished, check decode memory, retract, prepare."""
        batch = self.running
        initial = batch.batch_size()
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return batch, []
        retracted: list[Any] = []
        if not batch.check_decode_mem():
            retracted, _ratio, _abort = batch.retract_decode()
            for req in retracted:
                self.waiting.append(req)  # _add_request_to_queue(req, is_retracted=True)
        if batch.batch_size() < initial:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch, retracted
        batch.prepare_for_decode()
        return batch, retracted

    def step(self) -> dict[str, Any]:
        """One forward pass. An iteration that runs nothing but has work queued (the running batch
        only had finished requests to filter, which clears "batch is full") costs no model time, so
        the next iteration runs within the same step."""
        self.evicted = 0
        out = self._iteration()
        if out["kind"] == "idle" and self.waiting:
            evicted = self.evicted
            out = self._iteration()
            out["evicted_tokens"] += evicted
        return out

    def _iteration(self) -> dict[str, Any]:
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        self.evicted = 0
        waiting_ids = {r.rid for r in self.waiting}
        # get_next_batch_to_run: the chunked request leaves the last batch (its KV is checkpointed),
        # the rest of the last prefill batch joins the running batch
        if self.chunked_req is not None and self.chunked_req.extend_end > self.chunked_req.prefix_len:
            checkpoint_kv_cache(self.chunked_req, self.tree)
        lb = self.last_batch
        if lb is not None and lb.forward_mode.is_extend():
            excl = [lb.chunked_req] if lb.chunked_req is not None else []
            if self.chunked_req is not None:
                excl.append(self.chunked_req)
            n0 = lb.batch_size()
            lb.filter_batch(reqs_to_exclude=excl)
            if lb.batch_size() < n0:
                self.running.batch_is_full = False
            if not lb.is_empty():
                if self.running.is_empty():
                    self.running = lb
                else:
                    self.running.merge_batch(lb)
        new = self._new_prefill_batch()
        retracted: list[Any] = []
        if new is not None:
            batch = new
            kind = "prefill"
        elif not self.running.is_empty():
            batch, retracted = self._update_running()
            self.running = batch
            kind = "decode" if not batch.is_empty() else "idle"
            if batch.is_empty():
                batch = None
        else:
            batch, kind = None, "idle"
        out: dict[str, Any] = {
            "kind": kind,
            "batch": [],
            "new": [],
            "resumed": [],
            "preempted": [r.rid for r in retracted],
            "finished": [],
        }
        for r in retracted:
            self.live.discard(r.rid)
        if batch is not None:
            if kind == "prefill":
                out["batch"] = [[r.rid, int(r.extend_len)] for r in batch.reqs]
                for r in batch.reqs:
                    if r.rid in waiting_ids:
                        dst = "resumed" if r.rid in self.admitted_once else "new"
                        out[dst].append([r.rid, int(r.prefix_len)])
                        self.admitted_once.add(r.rid)
                        self.live.add(r.rid)
            else:
                out["batch"] = [[r.rid, 1] for r in batch.reqs]
            out["finished"] = self._process(batch, kind, release_kv_cache, checkpoint_kv_cache)
            self.live.difference_update(out["finished"])
            # the chunk's KV is stashed at the start of the next iteration; nothing touches the tree in
            # between, so doing it now is the same and makes the reported state the one admission sees
            if self.chunked_req is not None and self.chunked_req.extend_end > self.chunked_req.prefix_len:
                checkpoint_kv_cache(self.chunked_req, self.tree)
            self.last_batch = batch
        else:
            self.last_batch = None
        out.update(self._gauges())
        return out

    def _process(self, batch: Any, kind: str, release_kv_cache: Any, checkpoint_kv_cache: Any) -> list[str]:
        """process_batch_result_prefill / _decode with the caller's output ids as the sampled tokens."""
        finished: list[str] = []
        for req in batch.reqs:
            if kind == "prefill":
                if req.inflight_middle_chunks > 0:  # a middle chunk: no token
                    req.inflight_middle_chunks -= 1
                    continue
                if req.finished() or req.is_retracted:
                    continue
            else:
                if req.finished() or req.is_retracted:
                    continue
            req.output_ids.append(self.outputs[req.rid][len(req.output_ids)])
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, self.tree, checkpoint=True)
                finished.append(req.rid)
            elif kind == "prefill":
                checkpoint_kv_cache(req, self.tree)
        return finished

    def _gauges(self) -> dict[str, Any]:
        return {
            "evicted_tokens": self.evicted,
            "available": int(self.allocator.available_size()),
            "evictable": int(self.tree.evictable_size()),
            "protected": int(self.tree.protected_size()),
            "waiting": len(self.waiting),
            "running": len(self.live),
        }

    def flush(self) -> dict[str, Any]:
        """Scheduler.flush_cache: refused while anything runs or waits."""
        if self.waiting or not self.running.is_empty() or self.chunked_req is not None:
            return {"ok": False}
        self.tree.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        self.last_batch = None
        return {"ok": True}


def main() -> int:
    drv = Driver()
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "quit":
                break
            handler = {
                "init": drv.init,
                "add": drv.add,
                "step": lambda _m: drv.step(),
                "flush": lambda _m: drv.flush(),
            }.get(op)
            reply = handler(msg) if handler else {"error": f"unknown op {op!r}"}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=8)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
