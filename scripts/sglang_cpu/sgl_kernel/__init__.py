"""A pure-torch stand-in for the `sgl_kernel` module, for SGLang's CPU engine on machines without AMX.

SGLang (0.5.22) run with SGLANG_USE_CPU_ENGINE=1 imports a few CPU helpers from `sgl_kernel` at
module level. The only package that provides them is upstream's `sglang-kernel-cpu`, a C++ source
build that is on no package registry; the CUDA wheel `sglang-kernel` cannot be imported without
CUDA. This module provides the same names with plain torch / ctypes code:

- `assign_req_to_token_pool_cpu`: used on every prefill and decode step (writes the KV slots a
  request was given into its row of the request-to-token table).
- `copy_all_layer_kv_cache_cpu`: moves KV rows between slots of every layer buffer (used when
  SGLang relocates KV slots); written exactly, because a wrong copy would corrupt the cache silently.
- the speculative-decoding helpers raise NotImplementedError: speculative decoding is not used.

It deliberately registers nothing under `torch.ops.sgl_kernel`: SGLang then concludes that the Intel
AMX kernels are absent and takes its own torch code paths (RMSNorm, activations, RoPE, linear layers,
KV stores) instead of calling `torch.ops.sgl_kernel.*_cpu`.

This file is installed into the engine venv's site-packages by scripts/setup-sglang-cpu.sh; it is
not part of the harness package and is never imported by the harness.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

__version__ = "0.0.0+agentload.cpu.standin"

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


def _ints(t: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(t, torch.Tensor):
        t = t.detach().reshape(-1).cpu()
        if t.dtype == torch.uint64:  # addresses: same bits, int64 view converts cleanly
            t = t.view(torch.int64)
        return [int(x) for x in t.tolist()]
    return [int(x) for x in t]


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Request i gets the next end[i]-start[i] entries of out_cache_loc in columns [start[i], end[i]).

    The entries of out_cache_loc are consumed in request order, back to back: request 0 takes the
    first (end[0]-start[0]) of them, request 1 the following ones, and so on. `pool_len` is the row
    length of req_to_token; it only bounds the columns.
    """
    rows = _ints(req_pool_indices)
    starts = _ints(start_offset)
    ends = _ints(end_offset)
    if not (len(rows) == len(starts) == len(ends)):
        raise ValueError(f"batch mismatch: {len(rows)} rows, {len(starts)} starts, {len(ends)} ends")
    width = int(pool_len)
    taken = 0
    for row, lo, hi in zip(rows, starts, ends):
        n = hi - lo
        if n <= 0:
            continue
        if lo < 0 or hi > width:
            raise IndexError(f"columns [{lo}, {hi}) outside a row of {width}")
        if taken + n > out_cache_loc.numel():
            raise IndexError(f"out_cache_loc has {out_cache_loc.numel()} entries, {taken + n} needed")
        req_to_token[row, lo:hi] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer (base address p, row size s bytes): row tgt[j] := row src[j], for all j.

    All source rows are read before any target row is written (gather, then scatter), as one launch
    of the GPU kernel does, so a set of moves whose targets overlap its sources (a swap, a shift)
    moves the original rows. A target named twice gets the later source.
    """
    bases = _ints(data_ptrs)
    sizes = _ints(strides)
    if len(bases) != len(sizes):
        raise ValueError(f"{len(bases)} buffers but {len(sizes)} strides")
    tgts = _ints(tgt_loc)
    srcs = _ints(src_loc)
    if len(tgts) != len(srcs):
        raise ValueError(f"{len(tgts)} targets but {len(srcs)} sources")
    pairs = [(t, s) for t, s in zip(tgts, srcs) if t != s]
    if not pairs:
        return
    for base, size in zip(bases, sizes):
        staging = ctypes.create_string_buffer(size * len(pairs))
        tmp = ctypes.addressof(staging)
        for j, (_, s) in enumerate(pairs):
            ctypes.memmove(tmp + j * size, base + s * size, size)
        for j, (t, _) in enumerate(pairs):
            ctypes.memmove(base + t * size, tmp + j * size, size)


def _speculative_only(name: str):
    def fn(*_args, **_kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: speculative decoding is not available with the agentload CPU stand-in "
            "(no CPU build of sgl-kernel is installed)"
        )

    fn.__name__ = fn.__qualname__ = name
    return fn


assign_draft_cache_locs_contiguous_cpu = _speculative_only("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _speculative_only("assign_extend_cache_locs_cpu")
build_draft_decode_metadata_cpu = _speculative_only("build_draft_decode_metadata_cpu")
build_tree_kernel_efficient_cpu = _speculative_only("build_tree_kernel_efficient_cpu")
fill_accept_out_cache_loc_cpu = _speculative_only("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _speculative_only("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _speculative_only("rotate_input_ids_cpu")
verify_tree_greedy_cpu = _speculative_only("verify_tree_greedy_cpu")
