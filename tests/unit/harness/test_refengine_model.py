"""Engine model mechanisms: hit rules, FCFS memory gating, chunking, LPM, cache off, preemption."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.config import CellConfig
from harness.refengine.model import EngineCompletion, EngineModel, EngineRequest
from harness.refengine.request import output_ids


def cell(engine: str = "sglang", **kw: object) -> CellConfig:
    base: dict[str, object] = {
        "name": f"test-{engine}",
        "engine": {"name": engine, "version": "test"},
        "model": "m",
        "gpu": "g",
        "kv_pool_tokens": 300_000,
        "page_size": 1 if engine == "sglang" else 16,
        "batching": "separate" if engine == "sglang" else "mixed",
        "waiting_prefix_refresh": engine == "sglang",
    }
    base.update(kw)
    return CellConfig.model_validate(base)


def toks(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 32000, n, dtype=np.int32)


def drain(e: EngineModel, t: float = 0.0, horizon: float | None = None) -> tuple[float, list[EngineCompletion]]:
    out: list[EngineCompletion] = []
    while e.has_work():
        end = e.step(t, horizon)
        assert end is not None
        t = end
        out += e.complete(t)
    return t, out


def run_one(e: EngineModel, rid: int, prompt: np.ndarray, d: int = 100, t: float = 0.0) -> EngineCompletion:
    e.submit(EngineRequest(rid, prompt, d), t)
    _, out = drain(e, t)
    assert len(out) == 1
    return out[0]


# -- hit rules -------------------------------------------------------------------------------------
def test_sglang_follow_up_hits_all_but_last_output_token():
    e = EngineModel(cell())
    p1 = toks(2000, 0)
    c1 = run_one(e, 1, p1)
    assert c1.cached_tokens == 0 and c1.completion_tokens == 100 and len(c1.output_ids) == 100
    p2 = np.concatenate((p1, c1.output_ids, toks(550, 1)))
    c2 = run_one(e, 2, p2)
    assert c2.cached_tokens == 2000 + 99  # prefills the 550 new ids and the last output token
    assert c2.prompt_tokens - c2.cached_tokens == 551


def test_sglang_repeat_reuses_len_minus_one():
    e = EngineModel(cell())
    p = toks(1024, 3)
    run_one(e, 1, p, d=1)
    assert run_one(e, 2, p, d=1).cached_tokens == 1023


def test_vllm_hits_are_whole_blocks():
    e = EngineModel(cell("vllm"))
    p1 = toks(2000, 0)
    c1 = run_one(e, 1, p1)
    p2 = np.concatenate((p1, c1.output_ids, toks(550, 1)))
    c2 = run_one(e, 2, p2)
    assert c2.cached_tokens == 16 * ((2000 + 99) // 16)
    p = toks(1024, 7)
    run_one(e, 3, p, d=1)
    assert run_one(e, 4, p, d=1).cached_tokens == 1008  # a fully cached prompt recomputes its last block


def test_output_ids_are_deterministic_and_prompt_dependent():
    p = toks(500, 0)
    assert np.array_equal(output_ids(p, 100), output_ids(p.copy(), 100))
    assert not np.array_equal(output_ids(p, 100), output_ids(toks(500, 1), 100))
    a = run_one(EngineModel(cell()), 1, p)
    b = run_one(EngineModel(cell()), 9, p)
    assert np.array_equal(a.output_ids, b.output_ids) and a.output_ids.dtype == np.int32


# -- scheduling ------------------------------------------------------------------------------------
def test_memory_gated_fcfs_blocks_the_head_and_everything_behind_it():
    e = EngineModel(cell(kv_pool_tokens=10_000))
    e.submit(EngineRequest(1, toks(6000, 1), 100), 0.0)  # reserves 6100
    e.submit(EngineRequest(2, toks(5000, 2), 100), 0.0)  # would need 5100: waits
    e.submit(EngineRequest(3, toks(100, 3), 100), 0.0)  # would fit, but may not overtake
    end = e.step(0.0)
    assert e.gauges()["running"] == 1 and e.gauges()["waiting"] == 2
    done: list[EngineCompletion] = e.complete(end)
    t = end
    while not done:
        t = e.step(t)
        done = e.complete(t)
        if not done:
            assert e.gauges()["running"] == 1
    assert [c.req_id for c in done] == [1]
    t, rest = drain(e, t)
    assert sorted(c.req_id for c in rest) == [2, 3]
    assert all(c.first_token_time > done[0].done_time for c in rest)


def test_idle_cache_is_evicted_rather_than_blocking_admission():
    e = EngineModel(cell(kv_pool_tokens=10_000))
    run_one(e, 1, toks(8000, 1))
    assert e.gauges()["kv_evictable_tokens"] == 8099
    c = run_one(e, 2, toks(9000, 2))
    assert c.cached_tokens == 0
    assert e.gauges()["kv_evictable_tokens"] == 9099


def test_max_running_limits_admission():
    e = EngineModel(cell(max_running=2))
    for i in range(3):
        e.submit(EngineRequest(i, toks(100, i), 10), 0.0)
    e.complete(e.step(0.0))
    assert e.gauges()["running"] == 2 and e.gauges()["waiting"] == 1


def test_chunked_prefill_spreads_a_long_prompt_over_iterations():
    c = cell()
    cost = c.cost.model()
    e = EngineModel(c)
    e.submit(EngineRequest(1, toks(20_000, 1), 1), 0.0)
    ends = []
    t = 0.0
    while e.has_work():
        t = e.step(t)
        ends.append(t)
        out = e.complete(t)
    assert len(ends) == 3  # 8192 + 8192 + 3616
    expect = (
        cost.prefill_iteration(8192, 8192 * (0 + 8193 / 2))
        + cost.prefill_iteration(8192, 8192 * (8192 + 8193 / 2))
        + cost.prefill_iteration(3616, 3616 * (16384 + 3617 / 2))
    )
    assert t == pytest.approx(expect)
    assert out[0].first_token_time == pytest.approx(expect)


def test_prefill_has_priority_over_decode():
    e = EngineModel(cell())
    e.submit(EngineRequest(1, toks(100, 1), 50), 0.0)
    t = e.step(0.0)
    e.complete(t)  # request 1 is decoding now
    e.submit(EngineRequest(2, toks(100, 2), 50), t)
    gen = e.gauges()["generation_tokens_total"]
    t = e.step(t)
    e.complete(t)
    assert e.gauges()["generation_tokens_total"] == gen + 1  # a prefill ran: only request 2's first token


def test_lpm_prefers_cached_prefixes_until_the_queue_is_long():
    def order(n_wait: int) -> list[int]:
        e = EngineModel(cell(schedule_policy="lpm", lpm_fallback_waiting=4, kv_pool_tokens=20_000, max_running=1))
        cached = toks(3000, 99)
        run_one(e, 1000, cached, d=1)
        e.submit(EngineRequest(0, toks(200, 0), 1), 0.0)  # occupies the single running slot
        t = e.step(0.0)
        first = e.complete(t)
        for i in range(1, n_wait):
            e.submit(EngineRequest(i, toks(200, i), 1), t)
        e.submit(EngineRequest(n_wait, np.concatenate((cached, toks(10, 5))), 1), t)
        _, out = drain(e, t)
        return [c.req_id for c in first + out]

    assert order(3)[:2] == [0, 3]  # 3 waiting <= 4: the cached request jumps the queue
    # 6 waiting > 4: FCFS until the queue is down to 4, then the cached request jumps
    assert order(6) == [0, 1, 2, 6, 3, 4, 5]


def test_waiting_prefix_refresh_cadence_and_order():
    # SchedulePolicy: the first priority pass and every 32nd after it touch the first 128 waiting
    # prefixes, the head last
    from harness.refengine.scheduler import WaitingPolicy

    class KV:
        def __init__(self) -> None:
            self.log: list[tuple[int, int]] = []
            self.calls = 0

        def touch(self, req) -> None:
            self.log.append((self.calls, req))

    kv = KV()
    pol = WaitingPolicy(cell(), kv, radix_flavour=True)
    waiting = list(range(200))
    for call in range(65):
        kv.calls = call
        pol.calc_priority(waiting)  # type: ignore[arg-type]
    assert sorted({c for c, _ in kv.log}) == [0, 32, 64]
    first = [r for c, r in kv.log if c == 0]
    assert first == list(range(127, -1, -1))  # 128 of them, the head touched last


def test_waiting_prefix_refresh_runs_only_on_admission_attempts():
    # A long chunked prefill attempts admission every iteration (the chunk continues), so the
    # blocked waiting request's prefix is refreshed; with the refresh off it is not touched.
    def stamps(refresh: bool) -> tuple[int, int]:
        e = EngineModel(cell(kv_pool_tokens=40_000, chunked_prefill=256, max_running=1, waiting_prefix_refresh=refresh))
        p = toks(1000, 1)
        run_one(e, 1, p, d=1)
        tree = e.kv.tree  # type: ignore[union-attr]
        leaf = tree.leaves()[0]
        e.submit(EngineRequest(2, toks(256 * 40, 2), 4), 0.0)  # 40 chunks
        t = e.step(0.0)
        e.complete(t)
        e.submit(EngineRequest(3, np.concatenate((p, toks(100, 3))), 1), t)
        before = leaf.stamp
        for _ in range(36):
            t = e.step(t)
            e.complete(t)
        assert e.gauges()["waiting"] == 1
        return before, leaf.stamp

    before, after = stamps(True)
    assert after > before
    before, after = stamps(False)
    assert after == before


def test_cache_off_reuses_nothing_and_keeps_nothing():
    e = EngineModel(cell(prefix_cache=False))
    p = toks(1024, 3)
    run_one(e, 1, p)
    assert run_one(e, 2, p).cached_tokens == 0
    g = e.gauges()
    assert g["kv_evictable_tokens"] == 0 and g["kv_used_tokens"] == 0
    ev = EngineModel(cell("vllm", prefix_cache=False))
    run_one(ev, 1, p)
    assert run_one(ev, 2, p).cached_tokens == 0


def test_vllm_preempts_the_latest_request_and_recomputes_it_from_the_queue_head():
    e = EngineModel(cell("vllm", kv_pool_tokens=64 * 16, chunked_prefill=4096))
    e.submit(EngineRequest(1, toks(400, 1), 300), 0.0)  # grows to 44 blocks
    e.submit(EngineRequest(2, toks(400, 2), 300), 0.0)  # both fit at admission (26 blocks), not at the end
    _t, out = drain(e)
    assert sorted(c.req_id for c in out) == [1, 2]
    by = {c.req_id: c for c in out}
    assert by[1].preemptions == 0 and by[2].preemptions >= 1
    assert e.gauges()["preemptions_total"] >= 1
    alone = run_one(EngineModel(cell("vllm")), 2, toks(400, 2), d=300)
    assert np.array_equal(by[2].output_ids, alone.output_ids)
    assert by[2].completion_tokens == 300


def test_vllm_admits_only_when_the_whole_prompt_fits_not_just_the_first_chunk():
    # vLLM 0.32 (scheduler_reserve_full_isl, on by default): a waiting request's whole sequence
    # must fit the free blocks; only its first chunk is allocated. Pool 64 blocks of 16, chunk 256.
    e = EngineModel(cell("vllm", kv_pool_tokens=64 * 16, chunked_prefill=256, prefix_cache=False))
    e.submit(EngineRequest(1, toks(600, 1), 4), 0.0)  # 38 blocks once prefilled
    e.submit(EngineRequest(2, toks(600, 2), 4), 0.0)  # 38 more: its first chunk fits, the whole does not
    t = 0.0
    seen_both = False
    while e.has_work():
        t = e.step(t)
        assert t is not None
        g = e.gauges()
        seen_both |= g["running"] == 2
        e.complete(t)
    assert not seen_both  # request 2 waited for request 1 instead of being admitted on its first chunk
    assert e.gauges()["preemptions_total"] == 0


def test_vllm_admission_counts_hit_blocks_and_the_outputs_of_a_preempted_request():
    from harness.refengine.request import Req

    # 64 blocks, of which vLLM keeps one as its null block: 63 usable
    e = EngineModel(cell("vllm", kv_pool_tokens=64 * 16, chunked_prefill=256))
    kv = e.kv
    assert kv.pool.num_blocks == 63
    p = toks(600, 3)
    run_one(e, 1, p, d=1)  # 37 full blocks stay cached in the free queue; the partial 38th is not
    r = Req(EngineRequest(2, p, 4), 0.0, 99, 0)
    prefix = kv.match(r, True)
    assert prefix == 16 * 37
    assert kv.can_admit(r, prefix, 8)  # 37 hits taken out of the queue + 1 new block <= 63 free
    # the unhashed partial block is reused first, then the 25 never-used ones: the hits stay cached
    held = kv.pool.allocate(26)  # 37 free left, all of them the hits: the last block has no room
    r.hit = []
    prefix = kv.match(r, True)
    assert prefix == 16 * 37 and not kv.can_admit(r, prefix, 8)
    kv.pool.release(held)
    q = Req(EngineRequest(3, toks(100, 4), 200), 0.0, 100, 0)
    q.target = 100 + 200  # resumed after a preemption: prompt plus the 200 outputs so far
    q.hit = []
    held = kv.pool.allocate(63 - 18)  # 18 free: the first chunk (1 block) fits, the 19-block sequence not
    assert not kv.can_admit(q, 0, 16)
    kv.pool.release(held[:1])
    assert kv.can_admit(q, 0, 16)


# -- API -----------------------------------------------------------------------------------------
def test_submit_rejects_what_the_server_would_refuse():
    e = EngineModel(cell(context_length=4096))
    with pytest.raises(ValueError):
        e.submit(EngineRequest(1, toks(4096, 1), 10), 0.0)
    with pytest.raises(ValueError):
        e.submit(EngineRequest(2, toks(0, 1), 10), 0.0)
    assert not e.has_work()


def test_flush_refused_while_busy_and_empties_the_cache():
    e = EngineModel(cell())
    p = toks(500, 1)
    run_one(e, 1, p)
    e.submit(EngineRequest(2, toks(10, 2), 5), 0.0)
    assert e.flush_cache() is False
    drain(e)
    assert e.flush_cache() is True
    assert e.gauges()["kv_evictable_tokens"] == 0
    assert run_one(e, 3, p).cached_tokens == 0


def test_gauges_have_the_engine_meanings():
    e = EngineModel(cell())
    e.submit(EngineRequest(1, toks(500, 1), 20), 0.0)
    e.complete(e.step(0.0))
    g = e.gauges()
    assert set(g) == {
        "running",
        "waiting",
        "kv_used_tokens",
        "kv_evictable_tokens",
        "pool_tokens",
        "prompt_tokens_total",
        "cached_tokens_total",
        "generation_tokens_total",
        "preemptions_total",
    }
    assert g["running"] == 1 and g["kv_used_tokens"] == 500 and g["pool_tokens"] == 300_000
    assert g["prompt_tokens_total"] == 500 and g["generation_tokens_total"] == 1
    assert not e.busy and e.has_work()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_fused_decode_gives_the_same_times_as_stepping(engine: str):
    def run(horizon: float | None) -> list[tuple[int, float, float]]:
        e = EngineModel(cell(engine))
        for i in range(6):
            e.submit(EngineRequest(i, toks(300 + 100 * i, i), 40 + 7 * i), 0.0)
        _, out = drain(e, 0.0, horizon)
        return sorted((c.req_id, c.first_token_time, c.done_time) for c in out)

    a, b = run(None), run(math.inf)
    assert [x[0] for x in a] == [x[0] for x in b]
    for x, y in zip(a, b):
        assert x[1] == pytest.approx(y[1], rel=1e-12) and x[2] == pytest.approx(y[2], rel=1e-12)


def test_lpm_stock_fallback_is_more_than_128_waiting():
    def first_two(n_wait: int) -> list[int]:
        e = EngineModel(cell(schedule_policy="lpm", max_running=1))
        cached = toks(3000, 99)
        run_one(e, 10_000, cached, d=1)
        for i in range(n_wait - 1):
            e.submit(EngineRequest(i, toks(50, 1000 + i), 1), 0.0)
        e.submit(EngineRequest(n_wait - 1, np.concatenate((cached, toks(10, 5))), 1), 0.0)
        _, out = drain(e)
        return [c.req_id for c in out[:2]]

    assert first_two(128) == [127, 0]  # 128 waiting: sorted, the cached request first
    assert first_two(129) == [0, 128]  # 129 waiting: FCFS for one pass, then sorted again
