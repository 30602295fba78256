"""vLLM's own V1 scheduler, KV cache manager and block pool, driven step by step over JSON lines.

Runs INSIDE the vLLM engine venv (it imports vllm; the harness never does): the harness spawns
`<vllm python> vllm_driver.py` and talks to it on stdin/stdout, one JSON object per line. This is
how vLLM's own scheduler unit tests exercise the scheduler: a real `Scheduler` built from a
`VllmConfig`, a `KVCacheConfig` with one full-attention group and no tensors, and fake model
outputs (the sampled token of each request is supplied by the caller), so every decision --
prefix-cache hits, admission, chunking, preemption, block eviction -- is vLLM's own code.

Messages (request -> reply, one JSON object a line):
  {"op": "init", "model": DIR, "num_blocks": N, "block_size": B, "max_num_seqs": S,
   "max_num_batched_tokens": T, "max_model_len": L, "prefix_caching": true}
      -> {"ok": true, "version": "0.32.0", "usable_blocks": N - 1, "reserve_full_isl": bool}
  {"op": "add", "id": "r1", "prompt": [ids], "max_tokens": d, "output": [d ids]}  -> {"ok": true}
  {"op": "step"} -> {"batch": [[id, tokens], ...], "new": [[id, cached], ...],
                     "resumed": [[id, computed], ...], "preempted": [id, ...],
                     "finished": [id, ...], "evicted": [digest, ...], "free_blocks": n,
                     "waiting": n, "running": n}
  {"op": "flush"} -> {"ok": bool}
  {"op": "quit"}  -> (exits)
Errors come back as {"error": "..."}.

Evicted blocks are reported by a canonical digest of the tokens they hold (a blake2b chain over
the block contents, the same chain the harness computes), so the two sides can compare *which*
cached content was evicted without sharing vLLM's hash function. The only instrumentation is a
wrapper that records the hash of each block vLLM's `BlockPool._maybe_evict_cached_block` drops;
it does not change what the pool does.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import traceback
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def chain_digests(tokens: list[int], block: int, start: int = 0, prev: str = "") -> list[str]:
    """Digest of each full block i >= start: blake2b(prev digest + int32 ids of block i)."""
    out: list[str] = []
    n = len(tokens) // block
    for i in range(start, n):
        h = hashlib.blake2b(
            prev.encode() + struct.pack(f"<{block}i", *tokens[i * block : (i + 1) * block]), digest_size=8
        )
        prev = h.hexdigest()
        out.append(prev)
    return out


_HOOKED = False


def _install_hooks(drv: Driver, bp: Any, scheduler_cls: Any, get_block_hash: Any) -> None:
    """Record evictions and preemptions (once per process; every scheduler built later shares them)."""
    global _HOOKED
    orig_evict = bp.BlockPool._maybe_evict_cached_block

    def evict_hook(pool: Any, block: Any) -> bool:
        h = block.block_hash
        if h is not None:
            drv.evicted.append(drv.hash_to_digest.get(bytes(get_block_hash(h)), "?"))
        return orig_evict(pool, block)

    orig_preempt = scheduler_cls._preempt_request

    def preempt_hook(sched: Any, request: Any, *a: Any, **kw: Any) -> None:
        drv.preempted.append(request.request_id)
        return orig_preempt(sched, request, *a, **kw)

    bp.BlockPool._maybe_evict_cached_block = evict_hook
    scheduler_cls._preempt_request = preempt_hook
    _HOOKED = True


class Driver:
    def __init__(self) -> None:
        self.sched: Any = None
        self.outputs: dict[str, list[int]] = {}
        self.digests: dict[str, list[str]] = {}  # request -> digest of each hashed block
        self.hash_to_digest: dict[bytes, str] = {}
        self.evicted: list[str] = []
        self.preempted: list[str] = []

    # -- setup ------------------------------------------------------------------------------------
    def init(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch
        import vllm
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import block_pool as bp
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.outputs, self.digests, self.hash_to_digest = {}, {}, {}
        B = int(msg["block_size"])
        N = int(msg["num_blocks"])
        L = int(msg["max_model_len"])
        self.block = B
        sc = SchedulerConfig(
            max_num_seqs=int(msg["max_num_seqs"]),
            max_num_batched_tokens=int(msg["max_num_batched_tokens"]),
            max_model_len=L,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        mc = ModelConfig(model=msg["model"], dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=L)
        cc = CacheConfig(block_size=B, enable_prefix_caching=bool(msg.get("prefix_caching", True)))
        vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)
        kcc = KVCacheConfig(
            num_blocks=N,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"], FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=1, dtype=torch.float32)
                )
            ],
        )
        cc.num_gpu_blocks = N
        hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(B, hash_fn)
        self.sched = Scheduler(
            vllm_config=vc,
            kv_cache_config=kcc,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=B,
            log_stats=True,
        )
        if not _HOOKED:
            _install_hooks(self, bp, Scheduler, get_block_hash)
        pool = self.sched.kv_cache_manager.block_pool
        return {
            "ok": True,
            "version": vllm.__version__,
            "usable_blocks": pool.get_num_free_blocks(),
            "reserve_full_isl": bool(self.sched.scheduler_reserve_full_isl),
            "watermark_blocks": int(getattr(self.sched.kv_cache_manager, "watermark_blocks", 0)),
        }

    # -- requests ---------------------------------------------------------------------------------
    def add(self, msg: dict[str, Any]) -> dict[str, Any]:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        rid = str(msg["id"])
        sp = SamplingParams(max_tokens=int(msg["max_tokens"]), ignore_eos=True, temperature=0.0)
        req = Request(
            request_id=rid,
            prompt_token_ids=list(msg["prompt"]),
            sampling_params=sp,
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.outputs[rid] = list(msg["output"])
        self.digests[rid] = []
        self.sched.add_request(req)
        self._learn(req)
        return {"ok": True}

    def _learn(self, req: Any) -> None:
        """Map vLLM's block hashes of `req` to canonical digests (new full blocks only)."""
        have = self.digests[req.request_id]
        hashes = req.block_hashes
        if len(hashes) <= len(have):
            return
        toks = list(req.all_token_ids)
        new = chain_digests(toks[: len(hashes) * self.block], self.block, len(have), have[-1] if have else "")
        for i, d in enumerate(new, start=len(have)):
            self.hash_to_digest[bytes(hashes[i])] = d
        have.extend(new)

    def step(self) -> dict[str, Any]:
        from vllm.v1.outputs import ModelRunnerOutput

        s = self.sched
        self.evicted = []
        self.preempted = []
        so = s.schedule()
        batch = [[rid, int(n)] for rid, n in so.num_scheduled_tokens.items()]
        new = [[r.req_id, int(r.num_computed_tokens)] for r in so.scheduled_new_reqs]
        cr = so.scheduled_cached_reqs
        resumed = [[rid, int(c)] for rid, c in zip(cr.req_ids, cr.num_computed_tokens) if rid in cr.resumed_req_ids]
        ids: list[str] = []
        sampled: list[list[int]] = []
        for rid, _n in batch:
            req = s.requests[rid]
            ids.append(rid)
            if req.num_computed_tokens >= req.num_tokens:  # prefill complete or decode: one token sampled
                sampled.append([self.outputs[rid][len(req.output_token_ids)]])
            else:
                sampled.append([])
        mro = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
        )
        eco = s.update_from_output(so, mro)
        finished: list[str] = []
        for outs in eco.values():
            for o in outs.outputs:
                if o.finish_reason is not None:
                    finished.append(o.request_id)
        for rid in ids:
            req = s.requests.get(rid)
            if req is not None:
                self._learn(req)
        pool = s.kv_cache_manager.block_pool
        return {
            "batch": batch,
            "new": new,
            "resumed": resumed,
            "preempted": list(self.preempted),
            "finished": finished,
            "evicted": list(self.evicted),
            "free_blocks": pool.get_num_free_blocks(),
            "waiting": len(s.waiting),
            "running": len(s.running),
        }

    def flush(self) -> dict[str, Any]:
        return {"ok": bool(self.sched.reset_prefix_cache())}


def main() -> int:
    drv = Driver()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything vLLM prints goes to stderr, never into the replies
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
        except Exception as exc:  # report, keep serving: the harness decides what a failure means
            reply = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=6)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
