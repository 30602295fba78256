"""The workload's draws and a request's output ids: their fast paths give exactly what the direct
formulations give.

Each fast path replaced a direct formulation for speed only (benchmarks/bench_refengine.py); these
tests keep the direct one beside it and compare them value by value, so a run record cannot
change because a fast path did. (The engine model's own fast paths: test_refengine_fastpaths.py.)"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from harness.config import WorkloadConfig, load_config
from harness.refengine.model import EngineRequest
from harness.refengine.request import Req, output_ids
from harness.workload import blockdraw
from harness.workload.draws import _TOKEN_DOMAIN, STREAM_BASE, _philox_key, _scratch_philox, draw_session, turn_tokens


# -- the Philox keys of the token and session streams -----------------------------------------------
def _numpy_key(key: tuple[int, ...]) -> tuple[int, int]:
    return tuple(int(x) for x in np.random.SeedSequence(list(key)).generate_state(2, np.uint64))  # type: ignore[return-value]


def test_philox_key_is_numpys_seed_sequence() -> None:
    rng = np.random.default_rng(7)
    keys: list[tuple[int, ...]] = []
    for _ in range(3000):  # the token streams: (domain, seed low word, seed high word, turn)
        seed = int(rng.integers(0, 2**63 - 1))
        keys.append((_TOKEN_DOMAIN, seed & 0xFFFFFFFF, seed >> 32, int(rng.integers(1, 65))))
    for _ in range(3000):  # the session streams: (plan seed, stream, index)
        keys.append((int(rng.integers(0, 2**31)), int(rng.integers(0, 3)), int(rng.integers(0, 10**6))))
    keys += [(), (0,), (0, 0, 0, 0), (2**32,), (2**64 + 5, 0, 2**96), tuple(range(1, 12)), tuple(range(30))]
    for key in keys:
        got = _philox_key(key)
        assert tuple(int(x) for x in got) == _numpy_key(key), key


def test_token_key_is_numpys_seed_sequence() -> None:
    """A session's turn keys from the part its turns share (derived once per session, kept for
    recent sessions) are numpy's SeedSequence of (domain, seed low word, seed high word, turn)."""
    from harness.workload import draws

    rng = np.random.default_rng(8)
    seeds = [int(rng.integers(0, 2**63 - 1)) for _ in range(400)] + [0, 1, 2**32 - 1, 2**32, 2**63 - 2]
    for seed in seeds:
        for turn in [1, 2, *rng.integers(3, 65, size=3).tolist(), 0, 2**32 - 1]:
            want = _numpy_key((_TOKEN_DOMAIN, seed & 0xFFFFFFFF, seed >> 32, int(turn)))
            assert draws._token_key(seed, int(turn)) == want, (seed, turn)
        turns = range(0, 66)  # a session's keys at once (the block draw's), the cap and beyond
        assert draws._token_keys(seed, turns) == [
            _numpy_key((_TOKEN_DOMAIN, seed & 0xFFFFFFFF, seed >> 32, t)) for t in turns
        ]
    assert 0 < len(draws._TOKEN_POOLS) <= draws._TOKEN_POOLS_MAX


def test_philox_key_refuses_what_numpy_refuses() -> None:
    with pytest.raises(ValueError):
        _philox_key((1, -2))


# -- a session's ids drawn in one block ---------------------------------------------------------------
def _counting_fallback(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the blocks the block draw hands back to numpy (a rejected word among their first n)."""
    calls: list[int] = []
    numpy_draw = blockdraw._numpy_draw

    def counted(key: tuple[int, int], n: int, low: int, high: int) -> np.ndarray:
        calls.append(n)
        return numpy_draw(key, n, low, high)

    monkeypatch.setattr(blockdraw, "_numpy_draw", counted)
    return calls


def test_session_turn_ids_are_turn_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every turn of 300 sessions of the workload of record, then of workloads with odd sizes and
    other id ranges; some turns have a rejected word (they go to numpy) and are equal too."""
    fallbacks = _counting_fallback(monkeypatch)
    wl = load_config("workloads/standard", WorkloadConfig)
    odd = WorkloadConfig.model_validate({**wl.model_dump(), "first_prompt": 7, "tool_tokens": 1})
    narrow = WorkloadConfig.model_validate({**wl.model_dump(), "tool_tokens": 33, "token_ids": {"low": 0, "high": 3}})
    for w, sessions in ((wl, 300), (odd, 40), (narrow, 40)):
        for i in range(sessions):
            spec = draw_session(w, 5, STREAM_BASE, i)
            got = blockdraw.session_turn_ids(w, spec)
            assert len(got) == spec.n_turns
            for k in range(1, spec.n_turns + 1):
                want = turn_tokens(w, spec, k)
                assert got[k - 1].dtype == np.int32 and np.array_equal(got[k - 1], want), (i, k)
    assert len(fallbacks) >= 3  # the rejection path ran (about 1 turn in 250 of the workload of record)


@pytest.mark.parametrize(
    "low, high",
    [(4, 32000), (0, 1_610_612_736), (-5, 7), (0, 2), (-(2**31), 2**31 - 1), (-(2**31), 2**31), (0, 1), (9, 10)],
)
def test_bounded_blocks_are_numpys_integers(monkeypatch: pytest.MonkeyPatch, low: int, high: int) -> None:
    """The bounded map against numpy's own draw: ranges that reject a quarter of all words
    (0..1.5 * 2**30), the full int32 range and the ones numpy treats apart (one or two values)."""
    fallbacks = _counting_fallback(monkeypatch)
    rng = np.random.default_rng(low & 0xFFFF ^ high)
    keys = [(int(rng.integers(0, 2**63)), int(rng.integers(0, 2**63))) for _ in range(60)]
    sizes = [int(rng.integers(1, 9 if i % 2 else 400)) for i in range(60)]  # short blocks: some take no rejection
    got = blockdraw.bounded_int32_blocks(keys, sizes, low, high)
    for key, n, g in zip(keys, sizes, got, strict=True):
        want = _scratch_philox(*key).integers(low, high, size=n, dtype=np.int32)
        assert g.dtype == np.int32 and np.array_equal(g, want), (key, n)
    if (low, high) == (0, 1_610_612_736):
        assert 30 < len(fallbacks) < 60  # every long block rejects a word, not every short one


# -- the engine's stand-in outputs --------------------------------------------------------------------
def _direct_output_ids(prompt: np.ndarray, n: int, salt: int = 0) -> np.ndarray:
    return _direct_output_ids_of(np.ascontiguousarray(prompt[-16:], dtype=np.int32).tobytes(), len(prompt), n, salt)


def _direct_output_ids_of(tail: bytes, length: int, n: int, salt: int = 0) -> np.ndarray:
    seed = (zlib.crc32(tail) << 32 | zlib.crc32(length.to_bytes(8, "little") + tail)) ^ (salt * 0x9E3779B97F4A7C15)
    seed &= (1 << 64) - 1
    z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z % np.uint64(32000)).astype(np.int32)


def test_output_ids_are_the_direct_splitmix() -> None:
    rng = np.random.default_rng(3)
    for _ in range(600):
        p = rng.integers(4, 32000, size=int(rng.integers(1, 3000)), dtype=np.int32)
        n, salt = int(rng.integers(1, 10_000)), int(rng.integers(0, 4))
        want = _direct_output_ids(p, n, salt)
        for _twice in range(2):  # the second call reads the cached counter multiples
            got = output_ids(p, n, salt)
            assert got.dtype == np.int32 and np.array_equal(got, want)


def test_a_requests_outputs_are_those_of_its_prompt() -> None:
    """Req takes the splitmix seed's tail from its prompt bytes (output_ids_of), not the array."""
    rng = np.random.default_rng(5)
    for i in range(300):
        n_ids = int(rng.integers(1, 60)) if i % 2 else int(rng.integers(1, 3000))
        p = rng.integers(4, 32000, size=n_ids, dtype=np.int32)
        n, salt = int(rng.integers(1, 300)), int(rng.integers(0, 4))
        r = Req(EngineRequest(i, p, n), 0.0, i, salt)
        assert r.out.dtype == np.int32 and np.array_equal(r.out, _direct_output_ids(p, n, salt))
        assert r.outb == r.out.tobytes()
        assert len(p) == r.L


def _direct_draw_session(wl: WorkloadConfig, seed: int, stream: int, index: int) -> tuple:
    """draw_session on a freshly built Philox, its uniforms as numpy gives them."""
    import math

    g = np.random.Generator(np.random.Philox(key=np.array(_philox_key((seed, stream, index)), dtype=np.uint64)))
    u = g.random(65)
    token_seed = int(g.integers(0, 2**63 - 1))
    p = 1.0 / wl.turns.mean
    n = 1 if u[0] <= 0.0 else int(min(max(math.ceil(math.log1p(-u[0]) / math.log1p(-p)), 1), wl.turns.cap))
    tools = tuple(float(-wl.tool_time.mean * math.log1p(-x)) for x in u[1:n])
    return n, tools, token_seed, float(u[0])


def test_session_draws_on_the_scratch_generator_are_a_fresh_philoxs() -> None:
    wl = load_config("workloads/standard", WorkloadConfig)
    for seed, stream, index in [(0, 2, i) for i in range(150)] + [(7, 0, 3), (2**40, 1, 9), (1, 2, 2**33)]:
        turn_tokens(wl, draw_session(wl, 1, 2, 1), 1)  # the scratch generator was used for something else
        spec = draw_session(wl, seed, stream, index)
        got = (spec.n_turns, spec.tool_times, spec.token_seed, spec.u_turns)
        assert got == _direct_draw_session(wl, seed, stream, index)
        assert all(type(t) is float for t in spec.tool_times) and type(spec.u_turns) is float
