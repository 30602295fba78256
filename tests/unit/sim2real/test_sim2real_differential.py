"""The differential machinery without an engine: traces, the lockstep runner and its comparator,
the digests the drivers share, and the engine-model behaviours the real engines' code pinned down.

The comparisons against the engines' own code are in tests/integration/test_sim2real_engines.py
(markers vllm / sglang); here the runner is checked on our model against itself and against a
deliberately perturbed copy, so an agreement of 1.0 there means something.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from harness.refengine.blocks import BlockPool
from harness.refengine.kv import BlockKV, TokenKV
from harness.refengine.request import EngineRequest, Req
from sim2real.differential import run_trace, summarize
from sim2real.digest import chain_digests
from sim2real.engineproc import DRIVERS, EngineProcError, engine_python
from sim2real.ours import OurEngine, OurRadixEngine, sglang_cell, vllm_cell
from sim2real.suite import OurSide
from sim2real.traces import EngineShape, TraceSpec, default_suite, make_trace


def _driver_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, DRIVERS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_traces_are_deterministic_and_fit_the_engine() -> None:
    for spec in default_suite(seeds=2):
        a, b = make_trace(spec), make_trace(spec)
        assert a == b
        e = spec.engine
        limit = min(e.max_model_len, e.pool_tokens - e.block_size)
        for s in a.sessions:
            length = len(s.first_prompt)
            assert length + s.max_tokens[0] <= limit
            for k in range(1, s.n_turns):
                length = length if s.repeats[k - 1] else length + s.max_tokens[k - 1] + len(s.tools[k - 1])
                assert length + s.max_tokens[k] <= limit
    assert make_trace(default_suite()[0]) != make_trace(default_suite()[0].with_seed(99))


def test_the_vllm_driver_names_blocks_as_the_harness_does() -> None:
    # the driver imports vllm only inside its functions, so its module loads without the engine
    drv = _driver_module("vllm_driver")
    toks = list(range(4, 104))
    assert drv.chain_digests(toks, 16) == chain_digests(toks, 16)
    assert len(chain_digests(toks, 16)) == 6


class _Perturbed(OurSide):
    """Our model, but it reports one fewer eviction whenever it evicts (a planted disagreement)."""

    def step(self) -> dict[str, Any]:
        r = super().step()
        if r["evicted"]:
            r["evicted"] = r["evicted"][1:]
        return r


# prompts of up to 19 blocks on a 64-block pool: evictions and preemptions in most steps
_PRESSURE = TraceSpec(
    "pressure",
    sessions=16,
    arrival_span=10,
    first_prompt=(60, 300),
    engine=EngineShape(num_blocks=64, max_num_seqs=8),
)


def _pair(spec: TraceSpec, perturb: bool = False) -> Any:
    ref = OurEngine(vllm_cell(spec.engine))
    other = OurEngine(vllm_cell(spec.engine))
    side = _Perturbed(other) if perturb else OurSide(other)
    return run_trace(make_trace(spec), OurSide(ref), side, ref.outputs)


def test_runner_agrees_with_itself_and_catches_a_planted_difference() -> None:
    spec = _PRESSURE
    same = _pair(spec)
    assert same.tallies["evict"].total > 0 and same.tallies["preempt"].total > 0
    assert all(t.rate in (None, 1.0) for t in same.tallies.values())
    assert same.first_divergence is None
    bad = _pair(spec, perturb=True)
    assert bad.tallies["evict"].rate == 0.0  # every evicting step now disagrees
    assert bad.first_divergence is not None and bad.examples
    s = summarize([same, bad])
    assert s["overall"]["evict"]["total"] == same.tallies["evict"].total + bad.tallies["evict"].total


def test_radix_runner_agrees_with_itself() -> None:
    spec = TraceSpec(
        "workload",
        sessions=10,
        turns=(2, 5),
        first_prompt=(300, 300),
        tool_tokens=(60, 60),
        max_tokens=(8, 8),
        engine=EngineShape(
            num_blocks=120, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=2048
        ),
    )
    a, b = OurRadixEngine(sglang_cell(spec.engine)), OurRadixEngine(sglang_cell(spec.engine))
    res = run_trace(make_trace(spec), OurSide(a), OurSide(b), a.outputs)
    assert res.tallies["evict"].total > 0 and res.tallies["cached"].total == res.requests
    assert all(t.rate in (None, 1.0) for t in res.tallies.values())


def test_engine_python_needs_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLOAD_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineProcError, match="AGENTLOAD_VLLM_PYTHON"):
        engine_python("vllm")
    with pytest.raises(EngineProcError, match="expected one of"):
        engine_python("trt")


# -- what the engines' code pinned down in our model ------------------------------------------------
def test_block_pool_null_block_and_hashless_blocks_reused_first() -> None:
    kv = BlockKV(8 * 16, 16, True)
    assert kv.pool.num_blocks == 7 and kv.M == 7 * 16  # vLLM's block 0 is its null block
    pool = BlockPool(6, 16)
    a = pool.allocate(3)
    pool.register(a[:2], [11, 12])  # the third block is partial: no hash
    pool.release(a)
    # front: the hash-less block; then the never-used ones; the cached blocks last, tail first
    assert list(pool.free) == [a[2], 3, 4, 5, a[1], a[0]]


def test_block_pool_keeps_duplicate_hashes_like_vllm() -> None:
    pool = BlockPool(4, 16)
    b1, b2 = pool.allocate(1), pool.allocate(1)
    pool.register(b1, [7])
    pool.register(b2, [7])  # the same content computed twice: both blocks carry the hash
    assert pool.lookup([7], 1) == b1 and pool.dups[7] == b2
    pool.release(b1)
    pool.release(b2)
    pool.allocate(2)  # reuses the two never-used blocks first
    assert pool.lookup([7], 1) == b1
    pool.allocate(1)  # b1 is evicted: the content is still found in b2
    assert pool.lookup([7], 1) == b2 and 7 not in pool.dups


def test_radix_prompt_is_checkpointed_and_outputs_become_a_leaf_under_it() -> None:
    kv = TokenKV(10_000, 1, True)
    p = np.arange(4, 404, dtype=np.int32)
    r = Req(EngineRequest(1, p, 10), 0.0, 1, 0)
    kv.match(r)
    kv.admit(r, 0)
    kv.alloc(r, 400)
    kv.checkpoint(r, 400)  # prefill done: the prompt is in the tree, locked
    assert kv.tree.total == 400 and kv.tree.protected == 400 and kv.own == 0
    kv.grow(9)  # nine decode slots
    kv.finish(r)  # prompt + 9 outputs cached, unlocked; the outputs are their own leaf
    assert kv.tree.total == 409 and kv.tree.evictable == 409 and kv.own == 0
    assert kv.tree.evict(1) == 9  # the outputs go first, the prompt stays
    assert kv.tree.total == 400


class _CacheDiffEngine(OurEngine):
    """OurEngine that also counts each step's evictions from the cache's contents: a block that
    held a findable key before the step and does not hold it after was handed out meanwhile."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.mismatches: list[tuple[int, int]] = []
        self.seen = 0

    def _cached(self) -> dict[int, int]:
        pool = self.kv.pool
        out = {}
        for b in range(pool.num_blocks):
            h = pool.block_hash(b)
            if h is not None and pool.lookup([h], 1) == [b]:
                out[b] = h
        return out

    def step(self) -> dict[str, Any]:
        before = self._cached()
        res = super().step()
        pool = self.kv.pool
        gone = sum(1 for b, h in before.items() if pool.block_hash(b) != h)
        self.seen += len(res["evicted"])
        if gone != len(res["evicted"]):
            self.mismatches.append((gone, len(res["evicted"])))
        return res


def test_the_observer_sees_every_eviction_of_either_allocation_path() -> None:
    """Prompts of up to 19 blocks on a 64-block pool: chunks take the pool's array path (more than
    BlockPool.SMALL blocks), decode steps the few-at-a-time one. The observer that records `evict`
    for the comparison with vLLM must see the evictions of both, as the cache's own contents do
    (it once watched `allocate` alone and missed every chunk's)."""
    spec = _PRESSURE
    ours = _CacheDiffEngine(vllm_cell(spec.engine))
    run_trace(make_trace(spec), OurSide(ours), OurSide(OurEngine(vllm_cell(spec.engine))), ours.outputs)
    assert ours.seen > 0
    assert ours.mismatches == []
