"""Session specifications and the client's token content, derived from seeds alone.

A session is fully described by its turn count, its tool times and one token seed: the ids it sends
are regenerated on demand from (seed, turn), so a plan never stores the ~40k ids of a long session,
and the i-th session of a stream is the same object in every rate, arm, cell and test (common
random numbers, paper App. E.2). Each session draws from its own counter-based stream, keyed by
(plan seed, stream, index), so drawing session i never depends on how many others were drawn.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np

from harness.config import WorkloadConfig

# Stream identifiers inside one seed: independent families of sessions.
STREAM_BASE = 0  # the Poisson base stream (arrival order)
STREAM_BURST = 1  # the 200-session burst draw
STREAM_CLOSED = 2  # closed-population replacements (Stage C, E0a)

STREAM_KINDS = {STREAM_BASE: "base", STREAM_BURST: "burst", STREAM_CLOSED: "closed"}

# Fixed upper bound on turn counts across all workloads; uniforms are drawn for this many tool
# times so that changing the cap (MIRROR) keeps the same per-turn draws.
MAX_TURN_DRAWS = 64

_TOKEN_DOMAIN = 0x746F6B  # separates token streams from spec streams


# numpy's SeedSequence (pool of 4 32-bit words, hashmix / mix, then generate_state), written out
# for the key shapes drawn here: building a SeedSequence costs more than drawing a turn's ids, and
# every turn of every session derives one. The hash constants run through a fixed sequence, so
# they are tabulated. tests/test_refengine_fastpaths.py checks it against numpy key by key. The
# hashmix and mix steps stay written out in each loop: as helper calls they cost 14 -> 25 us a key.
_M32 = 0xFFFFFFFF
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715


def _hash_consts(init: int, mult: int, n: int) -> list[tuple[int, int]]:
    out = []
    h = init
    for _ in range(n):
        x = h
        h = (h * mult) & _M32
        out.append((x, h))
    return out


_SS_WORDS = 16  # longer entropy (never drawn here) goes through numpy itself
_SS_A = _hash_consts(0x43B0D7E5, 0x931E8875, 16 + 4 * _SS_WORDS)  # mix_entropy's hashmix constants
_SS_B = _hash_consts(0x8B51F9DD, 0x58F38DED, 4)  # generate_state's
_SS_PAIRS = [(s, d) for s in range(4) for d in range(4) if s != d]


def _philox_key(key: tuple[int, ...]) -> tuple[int, int] | np.ndarray:
    """The two 64-bit words `np.random.SeedSequence(list(key)).generate_state(2, np.uint64)` gives."""
    ent: list[int] = []
    for v in key:
        if v < 0:
            return np.random.SeedSequence(list(key)).generate_state(2, np.uint64)  # numpy's own error
        if v <= _M32:
            ent.append(v)
        else:
            while v:
                ent.append(v & _M32)
                v >>= 32
    if len(ent) > _SS_WORDS:
        return np.random.SeedSequence(list(key)).generate_state(2, np.uint64)
    if len(ent) < 4:
        ent += [0] * (4 - len(ent))
    consts = _SS_A
    pool = []
    for i in range(4):
        x, m = consts[i]
        v = ((ent[i] ^ x) * m) & _M32
        pool.append(v ^ (v >> 16))
    i = 4
    for s, d in _SS_PAIRS:
        x, m = consts[i]
        i += 1
        v = ((pool[s] ^ x) * m) & _M32
        v ^= v >> 16
        r = (_MIX_L * pool[d] - _MIX_R * v) & _M32
        pool[d] = r ^ (r >> 16)
    for s in range(4, len(ent)):
        for d in range(4):
            x, m = consts[i]
            i += 1
            v = ((ent[s] ^ x) * m) & _M32
            v ^= v >> 16
            r = (_MIX_L * pool[d] - _MIX_R * v) & _M32
            pool[d] = r ^ (r >> 16)
    st = []
    for j in range(4):
        x, m = _SS_B[j]
        v = ((pool[j] ^ x) * m) & _M32
        st.append(v ^ (v >> 16))
    return (st[0] | st[1] << 32, st[2] | st[3] << 32)


def _hashmix(v: int, step: int) -> int:
    x, m = _SS_A[step]
    v = ((v ^ x) * m) & _M32
    return v ^ (v >> 16)


def _mix(d: int, v: int) -> int:
    r = (_MIX_L * d - _MIX_R * v) & _M32
    return r ^ (r >> 16)


def _token_pool(token_seed: int) -> tuple[int, int, int, int, int, int]:
    """What the SeedSequences of a session's token streams, (domain, seed low, seed high, turn),
    share: the pool words and hashes that never read the turn. Of the mixing steps, (0,1) ... (2,1)
    leave words 0-2 as they are for every turn, and word 3 (the turn's) takes in word s's hash at
    steps (s,3), a hash that does not depend on the turn either."""
    p0 = _hashmix(_TOKEN_DOMAIN, 0)
    p1 = _hashmix(token_seed & _M32, 1)
    p2 = _hashmix(token_seed >> 32, 2)
    p1 = _mix(p1, _hashmix(p0, 4))  # (0,1)
    p2 = _mix(p2, _hashmix(p0, 5))  # (0,2)
    h03 = _hashmix(p0, 6)  # (0,3)
    p0 = _mix(p0, _hashmix(p1, 7))  # (1,0)
    p2 = _mix(p2, _hashmix(p1, 8))  # (1,2)
    h13 = _hashmix(p1, 9)  # (1,3)
    p0 = _mix(p0, _hashmix(p2, 10))  # (2,0)
    p1 = _mix(p1, _hashmix(p2, 11))  # (2,1)
    h23 = _hashmix(p2, 12)  # (2,3)
    return p0, p1, p2, h03, h13, h23


_TOKEN_POOLS: dict[int, tuple[int, int, int, int, int, int]] = {}  # token seed -> _token_pool (recent sessions)
_TOKEN_POOLS_MAX = 4096


def _token_key(token_seed: int, turn: int) -> tuple[int, int]:
    """`_philox_key((_TOKEN_DOMAIN, seed low word, seed high word, turn))` for 0 <= turn < 2**32,
    from the part a session's turns share, derived once per session (tests/test_workload_tokens.py
    checks it against numpy's SeedSequence)."""
    pool = _TOKEN_POOLS.get(token_seed)
    if pool is None:
        if len(_TOKEN_POOLS) >= _TOKEN_POOLS_MAX:
            del _TOKEN_POOLS[next(iter(_TOKEN_POOLS))]
        pool = _TOKEN_POOLS[token_seed] = _token_pool(token_seed)
    p0, p1, p2, h03, h13, h23 = pool
    # the per-turn steps written out (as helper calls they cost twice as much): word 3's hashmix,
    # its mixes with h03, h13, h23, then (3,0), (3,1), (3,2) and generate_state's hashes
    x, m = _SS_A[3]
    v = ((turn ^ x) * m) & _M32
    p3 = v ^ (v >> 16)
    for h in (h03, h13, h23):
        r = (_MIX_L * p3 - _MIX_R * h) & _M32
        p3 = r ^ (r >> 16)
    out = []
    for d, step in ((p0, 13), (p1, 14), (p2, 15)):
        x, m = _SS_A[step]
        v = ((p3 ^ x) * m) & _M32
        v ^= v >> 16
        r = (_MIX_L * d - _MIX_R * v) & _M32
        out.append(r ^ (r >> 16))
    out.append(p3)
    st = []
    for j in range(4):
        x, m = _SS_B[j]
        v = ((out[j] ^ x) * m) & _M32
        st.append(v ^ (v >> 16))
    return (st[0] | st[1] << 32, st[2] | st[3] << 32)


def _token_keys(token_seed: int, turns: range) -> list[tuple[int, int]]:
    """`[_token_key(token_seed, t) for t in turns]` with the session's shared part and the hash
    constants read once, and each turn's steps written out in full (a session's keys are all
    derived when its ids are drawn in one block: harness/workload/blockdraw.py)."""
    p0, p1, p2, h03, h13, h23 = _token_pool(token_seed)
    (x3, m3), (x13, m13), (x14, m14), (x15, m15) = _SS_A[3], _SS_A[13], _SS_A[14], _SS_A[15]
    (b0, n0), (b1, n1), (b2, n2), (b3, n3) = _SS_B
    ml, mr, mask = _MIX_L, _MIX_R, _M32
    keys = []
    for turn in turns:
        v = ((turn ^ x3) * m3) & mask
        p3 = v ^ (v >> 16)
        r = (ml * p3 - mr * h03) & mask
        p3 = r ^ (r >> 16)
        r = (ml * p3 - mr * h13) & mask
        p3 = r ^ (r >> 16)
        r = (ml * p3 - mr * h23) & mask
        p3 = r ^ (r >> 16)
        v = ((p3 ^ x13) * m13) & mask
        r = (ml * p0 - mr * (v ^ (v >> 16))) & mask
        o0 = r ^ (r >> 16)
        v = ((p3 ^ x14) * m14) & mask
        r = (ml * p1 - mr * (v ^ (v >> 16))) & mask
        o1 = r ^ (r >> 16)
        v = ((p3 ^ x15) * m15) & mask
        r = (ml * p2 - mr * (v ^ (v >> 16))) & mask
        o2 = r ^ (r >> 16)
        v0 = ((o0 ^ b0) * n0) & mask
        v1 = ((o1 ^ b1) * n1) & mask
        v2 = ((o2 ^ b2) * n2) & mask
        v3 = ((p3 ^ b3) * n3) & mask
        keys.append((v0 ^ (v0 >> 16) | (v1 ^ (v1 >> 16)) << 32, v2 ^ (v2 >> 16) | (v3 ^ (v3 >> 16)) << 32))
    return keys


def _generator(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=np.array(_philox_key(key), dtype=np.uint64)))


_ZERO4 = np.zeros(4, dtype=np.uint64)
_local = threading.local()


def _scratch_philox(k0: int, k1: int) -> np.random.Generator:
    """A per-thread generator reset to the fresh state of a Philox with key (k0, k1) (counter,
    buffer and carried bits zero). Building a Philox costs more than drawing a turn's ids; the
    draws are the same. Use it only for draws made at once, before the next call on this thread."""
    mine = getattr(_local, "scratch", None)
    if mine is None:
        key = np.zeros(2, dtype=np.uint64)
        state = {"bit_generator": "Philox", "state": {"counter": _ZERO4, "key": key}, "buffer": _ZERO4,
                 "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}  # fmt: skip
        mine = _local.scratch = (np.random.Generator(np.random.Philox(key=_ZERO4[:2])), key, state)
    g, key, state = mine
    key[0] = k0
    key[1] = k1
    g.bit_generator.state = state  # the setter copies the values; the dict is reused
    return g


def _turn_generator(token_seed: int, turn: int) -> np.random.Generator:
    """The generator of turn `turn`'s ids: `_generator(_TOKEN_DOMAIN, seed low, seed high, turn)`,
    its key from the session's shared part (_token_key), on the per-thread scratch generator."""
    k0, k1 = _token_key(token_seed, turn)
    return _scratch_philox(k0, k1)


@dataclass(frozen=True)
class SessionSpec:
    """What the client needs to play one session: no arrival semantics beyond `arrival`."""

    stream: int
    index: int  # position within its stream (arrival order for the base stream, draw order for bursts)
    arrival: float  # seconds after run start; NaN for closed-population sessions
    n_turns: int
    tool_times: tuple[float, ...]  # n_turns - 1 tool times, the sleep after turns 1..T-1
    token_seed: int
    u_turns: float = field(default=float("nan"), compare=False)  # the uniform behind n_turns
    refused: bool = False  # SHED: the session arrives (and is counted) but is turned away

    @property
    def kind(self) -> str:
        """'base', 'burst' or 'closed': the family the session belongs to, from its stream."""
        return STREAM_KINDS[self.stream]

    def prompt_tokens(self, workload: WorkloadConfig) -> int:
        """Prompt tokens the session sends over all its turns if every turn misses (W(T))."""
        return sum(workload.prompt_len(k) for k in range(1, self.n_turns + 1))


def turn_survival(workload: WorkloadConfig) -> np.ndarray:
    """G_k = P(T >= k) for k = 1..cap: the share of sessions that reach turn k (model F's weights)."""
    q = 1.0 - 1.0 / workload.turns.mean
    return q ** np.arange(workload.turns.cap, dtype=float)


def expected_turns(workload: WorkloadConfig) -> float:
    """E[T] = sum_k P(T >= k) = mean * (1 - q^cap): 14.761 for the workload of record."""
    q = 1.0 - 1.0 / workload.turns.mean
    return workload.turns.mean * (1.0 - q**workload.turns.cap)


def mean_turn_prompt(workload: WorkloadConfig) -> float:
    """The prompt length L_k averaged over the turns sent, turn k weighted by G_k = P(T >= k): the
    tokens an all-miss turn of the workload carries on average. Why: a speed pin's probe of that
    length reads the engine's all-miss speed on the workload's own turns
    (configs/cells/vllm-cpu-tiny-65k-fp32.yaml), which a shorter probe does not carry to another CPU."""
    g = turn_survival(workload)
    return float(sum(gk * workload.prompt_len(k) for k, gk in enumerate(g.tolist(), start=1)) / g.sum())


def hit_ceiling(workload: WorkloadConfig) -> float:
    """Long-run hit fraction bound 1 - 1/E[T]: every first turn misses, at best every later one hits."""
    return 1.0 - 1.0 / expected_turns(workload)


def turn_count(u: float, mean: float, cap: int) -> int:
    """Inverse CDF of min(Geometric(1/mean), cap) on {1, 2, ...} at uniform u in [0, 1)."""
    p = 1.0 / mean
    if u <= 0.0:
        return 1
    t = math.ceil(math.log1p(-u) / math.log1p(-p))
    return int(min(max(t, 1), cap))


def draw_session(
    workload: WorkloadConfig, seed: int, stream: int, index: int, arrival: float = float("nan")
) -> SessionSpec:
    """The index-th session of `stream` under `seed`: turn count, tool times and token seed.

    Turn count and tool times come from uniforms by inverse CDF, so a change of turn law (MIRROR) or
    tool mean is a deterministic transform of the same draw.
    """
    key = _philox_key((seed, stream, index))
    # the scratch generator reset to this key draws what a fresh Philox would, without building one
    g = _scratch_philox(*key) if isinstance(key, tuple) else _generator(seed, stream, index)
    u = g.random(1 + MAX_TURN_DRAWS).tolist()
    token_seed = int(g.integers(0, 2**63 - 1))
    n = turn_count(u[0], workload.turns.mean, workload.turns.cap)
    mean_z = workload.tool_time.mean
    log1p = math.log1p
    tools = tuple([-mean_z * log1p(-x) for x in u[1:n]])
    return SessionSpec(
        stream=stream,
        index=index,
        arrival=arrival,
        n_turns=n,
        tool_times=tools,
        token_seed=token_seed,
        u_turns=u[0],
    )


def turn_tokens(workload: WorkloadConfig, spec: SessionSpec, turn: int) -> np.ndarray:
    """The client-generated ids of turn `turn` (1-based): L0 ids for turn 1, Delta tool ids after.

    The full prompt of turn k is the previous prompt + the ids the server returned + these.
    """
    if turn < 1 or turn > spec.n_turns:
        raise ValueError(f"turn {turn} outside 1..{spec.n_turns}")
    n = workload.first_prompt if turn == 1 else workload.tool_tokens
    g = _turn_generator(spec.token_seed, turn)
    return g.integers(workload.token_ids.low, workload.token_ids.high, size=n, dtype=np.int32)
