"""The reference engine model (pure, clock-free): one mechanism per module.

cost.py       calibrated iteration costs (the one implementation; theory uses it too)
radix.py      SGLang-flavour radix prefix cache with LRU eviction of unlocked leaves
blocks.py     vLLM-flavour hashed block pool with an LRU free queue
kv.py         the two KV memories behind one interface (reservation-gated tokens; blocks)
scheduler.py  waiting-queue policy: FCFS head-of-line, LPM with its fallback, prefix refresh
request.py    request records and per-request state, deterministic output ids
model.py      EngineModel: submit / step / complete / gauges (iterations, decode, preemption)

Import EngineModel from harness.refengine.model (this package is imported by harness.config, so it
imports nothing itself).
"""
