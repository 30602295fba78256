"""The reference engine model (pure, clock-free): one mechanism per module.

cost.py       calibrated iteration costs (the one implementation; theory uses it too)
radix.py      SGLang-flavour radix prefix cache with LRU eviction of unlocked leaves
blocks.py     vLLM-flavour hashed block pool with an LRU free queue
kv.py         the two KV memories behind one interface (reservation-gated tokens; blocks)
scheduler.py  SGLang's waiting-queue policy: FCFS head-of-line, LPM with its fallback, prefix refresh
request.py    request records and per-request state, deterministic output ids
base.py       BaseEngine: submit / step / complete / gauges, the request lifecycle both flavours share
separate.py   SGLang's prefill admission arithmetic (PrefillAdder: reservations, the ignore_eos replay)
sglang.py     SGLangEngine: token radix KV, separate prefill and decode rounds
vllm.py       VLLMEngine: block KV, mixed batching, preemption; fused.py its fused decode-only steps
model.py      EngineModel(cell, seed): the factory that builds the cell's flavour

Import EngineModel from harness.refengine.model (this package is imported by harness.config, so it
imports nothing itself).
"""
