"""The engine model's fast paths give exactly what their direct formulations give (the workload's draws and a
request's output ids: test_draw_fastpaths.py).

Each fast path replaced a direct formulation for speed only (benchmarks/bench_refengine.py); these
tests keep the direct one beside it and compare them value by value, so a run record cannot
change because a fast path did."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from test_refengine_model import cell, toks

from harness.config import WorkloadConfig
from harness.refengine.kv import TokenKV
from harness.refengine.model import EngineModel, EngineRequest
from harness.refengine.radix import RadixCache
from harness.refengine.request import Req
from harness.refengine.separate import CLIP_MAX_NEW
from harness.workload.draws import STREAM_BASE, draw_session


# -- SGLang's admission budget ------------------------------------------------------------------------
def _direct_decode_left(e: EngineModel) -> int:
    tot = 0
    for req in e.running.values():
        if req.state == "decode":
            tot += min(req.max_tokens - (req.gen + (e.dstep - req.join)), CLIP_MAX_NEW)
    return tot


@pytest.mark.parametrize("mixed", [False, True])
def test_decode_left_is_the_sum_over_decoders(mixed: bool) -> None:
    """Requests of every size (some above the clip), arriving while others decode, in a pool small
    enough that admission waits on the budget; checked before every iteration."""
    c = cell(
        kv_pool_tokens=60_000,
        context_length=40_000,
        max_running=12,
        chunked_prefill=2048,
        batching="mixed" if mixed else "separate",
    )
    e = EngineModel(c)
    rng = np.random.default_rng(11)
    t, rid, checks, big = 0.0, 0, 0, 0
    for _wave in range(8):
        for _ in range(6):
            rid += 1
            d = int(rng.choice([1, 3, 40, 300, CLIP_MAX_NEW + 500, 9000]))
            big += d > CLIP_MAX_NEW
            e.submit(EngineRequest(rid, toks(int(rng.integers(50, 6000)), rid), d), t)
        for _ in range(int(rng.integers(20, 200))):
            if not e.has_work():
                break
            assert e.decode_left() == _direct_decode_left(e)
            checks += 1
            end = e.step(t, t + 0.05)
            assert end is not None
            t = end
            e.complete(t)
    while e.has_work():
        assert e.decode_left() == _direct_decode_left(e)
        checks += 1
        t = e.step(t, t + 0.05)  # type: ignore[assignment]
        e.complete(t)
    assert e.decode_left() == 0 and checks > 200 and big > 0


def test_decode_left_through_vllm_preemptions() -> None:
    e = EngineModel(cell("vllm", kv_pool_tokens=8_000, max_running=8, chunked_prefill=1024))
    for rid in range(1, 9):
        e.submit(EngineRequest(rid, toks(900, rid), 600), 0.0)
    t = 0.0
    while e.has_work():
        assert e.decode_left() == _direct_decode_left(e)
        t = e.step(t)  # type: ignore[assignment]
        e.complete(t)
    assert e.counters["preemptions"] > 0 and e.decode_left() == 0


# -- the radix tree's admission check -----------------------------------------------------------------
def test_evictable_if_locked_is_lock_then_read() -> None:
    rng = np.random.default_rng(5)
    tree = RadixCache(page_size=1)
    nodes = []
    base = toks(400, 0)
    for i in range(60):
        cut = int(rng.integers(1, 400))
        ids = np.concatenate((base[:cut], toks(int(rng.integers(1, 300)), 100 + i)))
        _n, node = tree.insert(ids.tobytes())
        nodes.append(node)
        if rng.random() < 0.3:
            tree.lock(node)
        if rng.random() < 0.2:
            tree.evict(int(rng.integers(1, 200)))
        for probe in rng.choice(len(nodes), size=5):
            nd = nodes[int(probe)]
            if not nd.alive:
                continue
            got = tree.evictable_if_locked(nd)
            tree.lock(nd)
            want = tree.evictable
            tree.unlock(nd)
            assert got == want


def test_the_admission_fit_is_need_below_the_pinned_budget() -> None:
    """TokenKV.fits skips the path walk when the bound by the path's depth decides; it answers as
    `need < free_and_evictable(req)` does, at every need around both the bound and the exact value."""
    rng = np.random.default_rng(11)
    kv = TokenKV(60_000, 1, True)
    base = toks(400, 1)
    reqs: list[Req] = []
    decided = 0
    for i in range(200):
        cut = int(rng.integers(0, 400)) if rng.random() < 0.5 else 0  # on a shared prefix, or not
        ids = np.concatenate((base[:cut], toks(int(rng.integers(1, 300)), 200 + i)))
        r = Req(EngineRequest(i, ids, 4), 0.0, i, 0)
        kv.match(r, True)
        reqs.append(r)
        if rng.random() < 0.4:  # admitted: its prompt goes into the tree, locked by it
            kv.admit(r, 0)
            kv.alloc(r, r.L)
            kv.checkpoint(r, r.L)
            if rng.random() < 0.5:  # and finished: unlocked, its path evictable again
                r.gen = r.max_tokens
                kv.alloc(r, r.max_tokens)
                kv.finish(r)
                kv.match(r, True)
        if rng.random() < 0.3 and kv.tree.evictable:
            kv.tree.evict(int(rng.integers(1, 300)))
        for r in rng.choice(np.array(reqs, dtype=object), size=4):
            if r.node is not None and not r.node.alive:
                continue
            exact = kv.free_and_evictable(r)
            bound = kv.free_and_evictable() - (r.node.depth if r.node is not None else 0)
            for need in {exact - 2, exact - 1, exact, exact + 1, bound - 1, bound, bound + 1}:
                assert kv.fits(r, need) == (need < exact)
                decided += need < bound
    assert decided > 100


# -- fused vLLM decode steps --------------------------------------------------------------------------
def _vllm_run(tmp, name: str, fuse: bool, monkeypatch: pytest.MonkeyPatch, history: bool = True, **cell_kw: object):
    from test_driver_virtual import cell as sim_cell

    import harness.refengine.kv as kv_mod
    import harness.refengine.model as model_mod
    from harness.client.openloop import PlanClient
    from harness.drivers.virtual import simulate
    from harness.recording.record import RunRecorder, load_run

    wl = WorkloadConfig(name="small", first_prompt=700, tool_tokens=120, decode_tokens=37)
    specs = [draw_session(wl, 4, STREAM_BASE, i, arrival=float(1.5 * i)) for i in range(70)]
    kw: dict[str, object] = {
        "engine": {"name": "vllm", "version": "t"},
        "batching": "mixed",
        "page_size": 16,
        "kv_pool_tokens": 40_000,
    }
    kw.update(cell_kw)
    with monkeypatch.context() as mp:
        if not fuse:
            mp.setattr(model_mod, "plan_fused_decode", lambda *_a: None)
        if not history:
            mp.setattr(kv_mod, "HISTORY_SESSIONS", 0)
        with RunRecorder(tmp / name, {"what": "test"}) as rec:
            pc = PlanClient(specs, wl, sink=rec)
            res = simulate(pc, EngineModel(sim_cell(**kw)), recorder=rec, until=3000.0, gauge_interval=5.0)
    return res, load_run(tmp / name)


@pytest.mark.parametrize(
    "cell_kw",
    [
        {},  # roomy: long decode-only stretches
        {"kv_pool_tokens": 9_000},  # tight: preemptions, fusion cut short where a block is missing
        {"prefix_cache": False},
    ],
    ids=["roomy", "tight", "cache-off"],
)
def test_fused_vllm_decode_gives_the_records_of_stepping(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cell_kw: dict
) -> None:
    fused, a = _vllm_run(tmp_path, "fused", True, monkeypatch, **cell_kw)
    stepped, b = _vllm_run(tmp_path, "stepped", False, monkeypatch, **cell_kw)
    assert fused.iterations < stepped.iterations * (0.5 if not cell_kw else 0.9)  # it did fuse
    assert (fused.ok, fused.errors, fused.end_time) == (stepped.ok, stepped.errors, stepped.end_time)
    for table in ("turns", "sessions", "gauges"):
        x, y = getattr(a, table), getattr(b, table)
        cols = [c for c in x.columns if "wall" not in c]
        assert len(x) > 0 and x[cols].equals(y[cols]), table
    if cell_kw.get("kv_pool_tokens") == 9_000:
        assert a.gauges.preemptions_total.iloc[-1] > 0


@pytest.mark.parametrize("cell_kw", [{}, {"kv_pool_tokens": 9_000}], ids=["roomy", "tight"])
def test_vllm_lookups_from_the_last_turn_give_the_records_of_full_lookups(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cell_kw: dict
) -> None:
    import harness.refengine.blocks as blocks_mod

    calls = {"known": 0}
    real = blocks_mod.BlockPool.lookup_entries

    def counting(self, keys, max_blocks, known=None):  # type: ignore[no-untyped-def]
        calls["known"] += known is not None and known.size > 0
        return real(self, keys, max_blocks, known)

    monkeypatch.setattr(blocks_mod.BlockPool, "lookup_entries", counting)
    _r1, a = _vllm_run(tmp_path, "history", False, monkeypatch, **cell_kw)
    used = calls["known"]
    calls["known"] = 0
    _r2, b = _vllm_run(tmp_path, "full", False, monkeypatch, history=False, **cell_kw)
    assert used > 2 * calls["known"] + 100  # follow-ups started from their last turn's entries
    for table in ("turns", "sessions", "gauges"):
        x, y = getattr(a, table), getattr(b, table)
        cols = [c for c in x.columns if "wall" not in c]
        assert x[cols].equals(y[cols]), table
    assert (a.turns.cached_tokens > 0).mean() > (0.5 if not cell_kw else 0.02)  # the tight pool is trapped


# -- the radix tree: touches, locks and unlocks per path segment ------------------------------------
def _path(node) -> bytes:
    """The ids a node's path spells, root first: a node's identity in both trees."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return b"".join(reversed(parts))


def _nodes(t) -> list:
    out, stack = [], [t.root]
    while stack:
        nd = stack.pop()
        stack.extend(nd.children.values())
        out.append((_path(nd), nd))
    return out


def _tree_state(t) -> tuple:
    nodes, stack = [], [t.root]
    while stack:
        nd = stack.pop()
        stack.extend(nd.children.values())
        if nd is not t.root:
            nodes.append((_path(nd), nd.n, nd.lock > 0))
    return t.total, t.evictable, t.protected, sorted(nodes)


@pytest.mark.parametrize("page, seed", [(1, 0), (1, 1), (1, 2), (4, 3), (16, 4)])
def test_radix_tree_matches_the_direct_form_operation_by_operation(page: int, seed: int) -> None:
    """Sessions whose sequences grow turn by turn (some sharing a prefix, some forking inside an
    edge), looked up, inserted from the root or from a held node, locked, unlocked and evicted at
    random, on the direct node-by-node tree (tests/radix_reference.py) and on the fast one: every
    return value, the evicted amount and the tree (each node by the ids its path spells, its size
    and whether it is locked) are the same after every operation, so the eviction order is too."""
    from support.radix_reference import RadixCache as Direct

    rng = np.random.default_rng(seed)
    fast, direct = RadixCache(page), Direct(page)
    shared = toks(300, 1000 + seed)
    seqs: list[np.ndarray] = []
    held: list[tuple[object, object, int, int]] = []  # (fast node, direct node, depth, sequence)
    locks: list[tuple[object, object]] = []
    evictions = 0
    for step in range(2500):
        op = rng.random()
        if op < 0.12 or not seqs:  # a new session: fresh, on a shared prefix, or a fork of another
            r = rng.random()
            if r < 0.4 or not seqs:
                s = toks(int(rng.integers(5, 200)), 10_000 * seed + step)
            elif r < 0.7:
                s = np.concatenate(
                    (shared[: int(rng.integers(1, 300))], toks(int(rng.integers(1, 100)), 20_000 * seed + step))
                )
            else:
                base = seqs[int(rng.integers(len(seqs)))]
                s = np.concatenate(
                    (base[: int(rng.integers(1, len(base) + 1))], toks(int(rng.integers(1, 80)), 30_000 * seed + step))
                )
            seqs.append(s)
        elif op < 0.3:  # a session's next turn: its sequence grows
            i = int(rng.integers(len(seqs)))
            seqs[i] = np.concatenate((seqs[i], toks(int(rng.integers(1, 120)), 40_000 * seed + step)))
        elif op < 0.5:  # a lookup (touching, or an LPM probe without touching)
            i = int(rng.integers(len(seqs)))
            s = seqs[i].tobytes()
            limit = int(rng.integers(0, len(seqs[i]) + 1))
            touch = bool(rng.random() < 0.85)
            (nf, f), (nd, d) = fast.match(s, limit, touch), direct.match(s, limit, touch)
            assert nf == nd and _path(f) == _path(d)
            if f is not fast.root:
                held.append((f, d, nf, i))
        elif op < 0.65:  # an insert, from the root or resuming at a held node of the same sequence
            i = int(rng.integers(len(seqs)))
            cut = int(rng.integers(1, len(seqs[i]) + 1))
            s = seqs[i][:cut].tobytes()
            mine = [h for h in held if h[3] == i and h[0].alive and h[2] * 4 <= len(s)]  # type: ignore[attr-defined]
            if mine and rng.random() < 0.6:
                f0, d0, depth, _ = mine[int(rng.integers(len(mine)))]
                off = int(rng.integers(0, depth + 1))  # the fast form may be given only the tail from `off`
                lock = bool(rng.random() < 0.5)  # and lock the path it ends at, as a checkpoint does
                (af, f), (ad, d) = (
                    fast.insert_from(f0, depth, s[off * 4 :], cut, off, lock=lock),
                    direct.insert_from(d0, depth, s),
                )  # type: ignore[arg-type]
                if lock:
                    direct.lock(d)
                    locks.append((f, d))
            else:
                (af, f), (ad, d) = fast.insert(s), direct.insert(s)
            assert af == ad and _path(f) == _path(d)
            if f is not fast.root:
                held.append((f, d, len(_path(f)) // 4, i))
        elif op < 0.77:  # a request admitted on a held node locks its path
            live = [h for h in held if h[0].alive]  # type: ignore[attr-defined]
            if live:
                f, d, _, _ = live[int(rng.integers(len(live)))]
                assert fast.evictable_if_locked(f) == direct.evictable_if_locked(d)  # type: ignore[arg-type]
                fast.lock(f)  # type: ignore[arg-type]
                direct.lock(d)  # type: ignore[arg-type]
                locks.append((f, d))
        elif op < 0.9:  # one finishes
            if locks:
                f, d = locks.pop(int(rng.integers(len(locks))))
                fast.unlock(f)  # type: ignore[arg-type]
                direct.unlock(d)  # type: ignore[arg-type]
        else:  # memory is short
            k = int(rng.integers(1, 150))
            got, want = fast.evict(k), direct.evict(k)
            assert got == want
            evictions += got > 0
        assert _tree_state(fast) == _tree_state(direct), step
        assert all(n.depth * 4 == len(p) for p, n in _nodes(fast)), step  # the depth a node keeps
        assert all(f.alive == d.alive for f, d, _, _ in held)  # type: ignore[attr-defined]
    assert evictions > 50 and fast.total > 0


@pytest.mark.parametrize(
    "cell_kw", [{}, {"kv_pool_tokens": 12_000}, {"page_size": 16}], ids=["roomy", "tight", "paged"]
)
def test_sglang_lookups_from_the_last_turn_give_the_records_of_full_lookups(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cell_kw: dict
) -> None:
    """A follow-up's lookup starts at the node its session's last turn left (TokenKV._history)
    when that node is still cached; without the history every lookup walks from the root."""
    from test_driver_virtual import cell as sim_cell

    import harness.refengine.kv as kv_mod
    import harness.refengine.radix as radix_mod
    from harness.client.openloop import PlanClient
    from harness.drivers.virtual import simulate
    from harness.recording.record import RunRecorder, load_run

    calls = {"from": 0}
    real = radix_mod.RadixCache.match_from

    def counting(self, node, depth, ids, limit, touch=True):  # type: ignore[no-untyped-def]
        calls["from"] += depth > 0
        return real(self, node, depth, ids, limit, touch)

    monkeypatch.setattr(radix_mod.RadixCache, "match_from", counting)
    wl = WorkloadConfig(name="small", first_prompt=700, tool_tokens=120, decode_tokens=37)
    specs = [draw_session(wl, 4, STREAM_BASE, i, arrival=float(1.5 * i)) for i in range(70)]

    def run(name: str, history: bool):  # type: ignore[no-untyped-def]
        with monkeypatch.context() as mp:
            if not history:
                mp.setattr(kv_mod, "HISTORY_SESSIONS", 0)
            with RunRecorder(tmp_path / name, {"what": "test"}) as rec:
                pc = PlanClient(specs, wl, sink=rec)
                simulate(
                    pc,
                    EngineModel(sim_cell(**{"kv_pool_tokens": 40_000, **cell_kw})),
                    recorder=rec,
                    until=3000.0,
                    gauge_interval=5.0,
                )
        return load_run(tmp_path / name)

    a = run("history", True)
    used, calls["from"] = calls["from"], 0
    b = run("full", False)
    assert (
        used > (50 if "kv_pool_tokens" in cell_kw else 300) and calls["from"] == 0
    )  # follow-ups started at their last turn's node
    for table in ("turns", "sessions", "gauges"):
        x, y = getattr(a, table), getattr(b, table)
        cols = [c for c in x.columns if "wall" not in c]
        assert len(x) > 0 and x[cols].equals(y[cols]), table
    hits = (a.turns.cached_tokens > 0).mean()
    assert hits > 0.5 if "kv_pool_tokens" not in cell_kw else 0.02 < hits < 0.9  # the tight pool evicts


class _NoHistory(OrderedDict):  # type: ignore[type-arg]
    """A TokenKV history that keeps nothing: every lookup walks from the root."""

    def __setitem__(self, key: object, value: object) -> None:
        return None

    def move_to_end(self, key: object, last: bool = True) -> None:
        return None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_kv_lookups_from_the_history_are_root_walks(seed: int) -> None:
    """Sessions' turns on two token pools, one looking follow-ups up from the node the session's
    last turn left, one walking from the root: the next prompt extends the last turn's prompt by
    its outputs (as a client sends), by other ids than its outputs, or is cut short of it (a
    lookup limit below the remembered node); the same matches, the same tree, turn by turn."""
    from harness.refengine.kv import TokenKV
    from harness.refengine.request import Req

    rng = np.random.default_rng(seed)
    fast, walk = TokenKV(400_000, 1, True), TokenKV(400_000, 1, True)
    walk._history = _NoHistory()
    resumed = [0]
    match_from = fast.tree.match_from

    def counting(node, depth, ids, limit, touch=True):  # type: ignore[no-untyped-def]
        resumed[0] += depth > 0
        return match_from(node, depth, ids, limit, touch)

    fast.tree.match_from = counting  # type: ignore[method-assign]
    last: list[tuple[np.ndarray, np.ndarray]] = []  # per session: (prompt, outputs) of its last turn
    for step in range(600):
        rid = step + 1
        r = rng.random()
        if r < 0.2 or not last:
            prompt = toks(int(rng.integers(20, 300)), 100_000 * seed + rid)
            last.append((prompt, prompt[:0]))
            i = len(last) - 1
        else:
            i = int(rng.integers(len(last)))
            p, out = last[i]
            if r < 0.7:
                prompt = np.concatenate((p, out, toks(int(rng.integers(1, 60)), rid)))  # the client's follow-up
            elif r < 0.85:
                prompt = np.concatenate((p, toks(len(out) + 5, rid)))  # not the outputs it was given
            else:
                prompt = np.concatenate((p, out))[: int(rng.integers(1, len(p) + len(out) + 1))]  # shorter
        d = int(rng.integers(1, 40))
        reqs = [Req(EngineRequest(rid, prompt, d), 0.0, rid, 0) for _ in (fast, walk)]
        got = [kv.match(q, True) for kv, q in zip((fast, walk), reqs)]
        assert got[0] == got[1] and _path(reqs[0].node) == _path(reqs[1].node), step
        for kv, q, n in zip((fast, walk), reqs, got):
            kv.admit(q, n)
            kv.alloc(q, q.L - n)
            kv.checkpoint(q, q.L)
            kv.own += d - 1  # its decode tokens (the first came with the prefill)
            kv.finish(q)
        last[i] = (prompt, reqs[0].out)
        if rng.random() < 0.2:
            k = int(rng.integers(1, 1000))
            assert fast.tree.evict(k) == walk.tree.evict(k)
        assert _tree_state(fast.tree) == _tree_state(walk.tree), step
        assert fast.own == walk.own == 0
    assert resumed[0] > 100, resumed


# -- the vLLM flavour's prefix keys, read from the prompt and outputs in place --------------------------
def test_prefix_keys_of_parts_are_the_keys_of_their_concatenation() -> None:
    from harness.refengine.blocks import PrefixHasher

    rng = np.random.default_rng(4)
    for block in (1, 16, 32):
        h = PrefixHasher(block)
        for _ in range(200):
            a = toks(int(rng.integers(0, 900)), int(rng.integers(1 << 30)))
            b = toks(int(rng.integers(0, 300)), int(rng.integers(1 << 30)))
            nb = int(rng.integers(0, (a.size + b.size) // block + 1))
            whole = h.keys(np.concatenate((a, b)), nb)
            assert h.key_array((a, b), nb).tolist() == whole and len(whole) == nb
    with pytest.raises(ValueError):
        PrefixHasher(16).key_array((toks(20, 0),), 2)
