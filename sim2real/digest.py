"""Canonical digests of cached blocks, shared by the harness and the engine drivers.

Each engine addresses cached KV its own way (vLLM: chained block hashes; SGLang: radix nodes; our
model: numpy prefix keys). To compare *which* content an engine evicted, both sides name a full
block i of a token sequence by digest_i = blake2b(digest_{i-1} + int32 ids of block i). The drivers
carry a verbatim copy of this function (they import nothing from the harness); a test checks that
the copies agree.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def chain_digests(tokens: Sequence[int], block: int, start: int = 0, prev: str = "") -> list[str]:
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
