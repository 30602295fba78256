"""A session's token ids for every turn at once: the ids `draws.turn_tokens` gives, turn by turn.

A turn's ids are `Generator(Philox(key)).integers(low, high, n, int32)` on a fresh Philox of the
turn's key. numpy's `integers` costs several times the Philox draw itself (argument checks, a
reduction over `size`, one C loop per call), and a session plays ~15 turns, so the raw Philox
words of every turn are taken on the per-thread scratch generator (`random_raw`, the stream the
bounded draw reads) and numpy's bounded draw is applied to all of them in one array pass:

- `integers` of int32 draws uint32 words, the low then the high half of each 64-bit Philox
  output, and maps each word w to low + (w * r >> 32), r = high - low (Lemire's method), unless
  (w * r) mod 2**32 falls below (2**32 - r) mod r: then the word is rejected and another drawn;
- a turn with a rejected word among its first n (about 1 turn in 400 of the workload of record)
  is drawn again by numpy itself, so every turn's ids are exactly numpy's.

tests/unit/harness/test_refengine_fastpaths.py compares both forms, rejected words included.
"""

from __future__ import annotations

import bisect

import numpy as np

from harness.config import WorkloadConfig
from harness.workload.draws import SessionSpec, _scratch_philox, _token_keys

_U32 = 1 << 32


def bounded_int32_blocks(keys: list[tuple[int, int]], sizes: list[int], low: int, high: int) -> list[np.ndarray]:
    """`Generator(Philox(key)).integers(low, high, size=n, dtype=np.int32)` for each key and size,
    the bounded map applied to every block's raw words in one pass (see the module docstring)."""
    r = high - low
    if not (-(2**31) <= low < high <= 2**31) or r >= _U32 - 1 or r < 2:
        return [_numpy_draw(k, n, low, high) for k, n in zip(keys, sizes, strict=True)]  # numpy's own special cases
    words = [(n + 1) // 2 for n in sizes]  # 64-bit outputs: two uint32 words each
    raw = np.empty(sum(words), dtype=np.uint64)
    starts: list[int] = []  # each block's first uint32 word
    at = 0
    for (k0, k1), w in zip(keys, words, strict=True):
        starts.append(2 * at)
        raw[at : at + w] = _scratch_philox(k0, k1).bit_generator.random_raw(w)
        at += w
    u32 = raw.view(np.uint32)  # little-endian: each output's low half first, as numpy's next_uint32
    m = np.multiply(u32, np.uint64(r), dtype=np.uint64)
    halves = m.view(np.uint32)  # for each word w: (w * r) mod 2**32, then w * r >> 32
    rejected = np.flatnonzero(halves[0::2] < np.uint32((_U32 - r) % r))
    out32 = (halves[1::2] + np.uint32(low % _U32)).view(np.int32)  # numpy's off + value, mod 2**32
    blocks = [out32[a : a + n] for a, n in zip(starts, sizes, strict=True)]
    redo = set()
    for j in rejected.tolist():
        i = bisect.bisect_right(starts, j) - 1
        if j - starts[i] < sizes[i]:  # among the block's first n words (not its odd spare one)
            redo.add(i)
    for i in redo:
        blocks[i] = _numpy_draw(keys[i], sizes[i], low, high)
    return blocks


def _numpy_draw(key: tuple[int, int], n: int, low: int, high: int) -> np.ndarray:
    return _scratch_philox(*key).integers(low, high, size=n, dtype=np.int32)


def session_turn_ids(workload: WorkloadConfig, spec: SessionSpec) -> list[np.ndarray]:
    """The client-generated ids of each turn of `spec` (index 0: turn 1): `turn_tokens(workload,
    spec, k)` for k = 1..n_turns, drawn in one block."""
    keys = _token_keys(spec.token_seed, range(1, spec.n_turns + 1))
    sizes = [workload.first_prompt] + [workload.tool_tokens] * (spec.n_turns - 1)
    return bounded_int32_blocks(keys, sizes, workload.token_ids.low, workload.token_ids.high)
