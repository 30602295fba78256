"""Requests as the engine model sees them: the public records and the internal per-request state."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from harness.refengine.radix import Node


@dataclass
class EngineRequest:
    req_id: int
    prompt: np.ndarray  # int32 token ids
    max_tokens: int


@dataclass
class EngineCompletion:
    req_id: int
    output_ids: np.ndarray
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    submit_time: float
    first_token_time: float
    done_time: float
    preemptions: int = 0
    admit_time: float = float("nan")  # first admission (the engine's "scheduled")


_M64 = (1 << 64) - 1
_VOCAB = 32000  # output ids stay inside the client's id range
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# the constants as 0-d arrays: a ufunc takes them as they are, where a numpy scalar is converted
# to an array at every call (~0.2 us each, ten calls a request)
_U_VOCAB = np.array(_VOCAB, dtype=np.uint64)
_C1, _C2 = np.array(0xBF58476D1CE4E5B9, dtype=np.uint64), np.array(0x94D049BB133111EB, dtype=np.uint64)
_S30, _S27, _S31 = (np.array(s, dtype=np.uint64) for s in (30, 27, 31))
_NO_KEYS = np.empty(0, dtype=np.uint64)
_COUNTERS: dict[int, np.ndarray] = {}  # n -> (1..n) * golden ratio, read-only


def output_ids(prompt: np.ndarray, n: int, salt: int = 0) -> np.ndarray:
    """Deterministic stand-in for greedy decoding: a function of the prompt's tail and length.

    Two different sessions' prompts end in different random ids, so their outputs differ; the same
    prompt always yields the same ids, as greedy decoding would (so repeated runs and the canary
    see identical sequences).
    """
    tail = np.ascontiguousarray(prompt[-16:], dtype=np.int32).tobytes()
    return output_ids_of(tail, len(prompt), n, salt)


def output_ids_of(tail: bytes, length: int, n: int, salt: int = 0) -> np.ndarray:
    """`output_ids` of a prompt of `length` ids whose last (at most) 16 ids are `tail`, as int32
    bytes: a request holds its prompt as bytes already, so the tail is a slice of them."""
    seed = (zlib.crc32(tail) << 32 | zlib.crc32(length.to_bytes(8, "little") + tail)) ^ (salt * 0x9E3779B97F4A7C15)
    seed &= _M64
    # splitmix64 over a counter; unsigned array arithmetic wraps mod 2^64 without warnings. The
    # counter's multiples are kept per length and the steps run in place (one request per turn);
    # the in-place operators dispatch faster than the ufuncs called with out=.
    base = _COUNTERS.get(n)
    if base is None:
        base = np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN
        if n <= 8192 and len(_COUNTERS) < 256:
            _COUNTERS[n] = base
    z = base + np.array(seed, dtype=np.uint64)
    z ^= z >> _S30
    z *= _C1
    z ^= z >> _S27
    z *= _C2
    z ^= z >> _S31
    z %= _U_VOCAB  # < 32000: the int32 values themselves
    return z.astype(np.int32)


class Req:
    """Mutable state of one request inside the engine.

    `target` is the number of tokens the current prefill must cover: the prompt, or after a
    preemption (vLLM flavour) the prompt plus the tokens generated so far. `gen` counts output
    tokens produced before the current decode stint; during a stint the engine derives the live
    count from its global decode-iteration counter (`join`), so a decode iteration costs O(1)
    rather than O(running).
    """

    __slots__ = (
        "L",
        "admitted",
        "blocks",
        "cached",
        "done",
        "first_token",
        "gen",
        "hit",
        "hit_entries",
        "in_tree",
        "join",
        "key_array",
        "keys",
        "keys_len",
        "max_tokens",
        "ncached",
        "node",
        "out",
        "outb",
        "pb",
        "preemptions",
        "prefix",
        "prompt",
        "reserve",
        "rid",
        "seq",
        "state",
        "stint",
        "submit",
        "target",
    )

    def __init__(self, req: EngineRequest, now: float, seq: int, salt: int) -> None:
        prompt = np.ascontiguousarray(req.prompt, dtype=np.int32)
        self.rid = req.req_id
        self.prompt = prompt
        self.pb = pb = prompt.tobytes()
        self.L = len(pb) >> 2
        self.max_tokens = int(req.max_tokens)
        self.out = output_ids_of(pb[-64:], self.L, self.max_tokens, salt)
        self.outb = self.out.tobytes()
        self.submit = now
        self.seq = seq
        self.gen = 0
        self.join = 0
        self.stint = 0
        self.done = 0
        self.target = self.L
        self.cached = -1  # reported cached tokens, fixed at the first admission
        self.prefix = 0
        self.first_token = float("nan")
        self.admitted = float("nan")
        self.preemptions = 0
        self.node: Node | None = None  # radix flavour: the node its matched or inserted path ends at
        self.blocks: list[int] = []
        self.hit: list[int] | np.ndarray = []  # vLLM flavour: the blocks its lookup found (an array once looked up)
        self.hit_entries: np.ndarray | None = (
            None  # vLLM flavour: the hash entries of `hit` while waiting (BlockPool.lookup_entries)
        )
        self.reserve = 0
        self.keys: list[int] = []
        self.key_array: np.ndarray = _NO_KEYS  # vLLM flavour: `keys` as uint64
        self.keys_len = -1
        self.in_tree = 0  # radix flavour: leading tokens of the sequence this request holds in the tree
        self.ncached = 0  # leading blocks of `blocks` that carry their hash (vLLM flavour)
        self.state = "waiting"  # waiting | prefill | decode | done

    def seq_bytes(self) -> bytes:
        """The ids the next prefill covers, as bytes (prompt, plus outputs after a preemption)."""
        if self.target == self.L:
            return self.pb
        return self.pb + self.outb[: (self.target - self.L) * 4]
