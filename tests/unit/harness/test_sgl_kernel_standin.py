"""The pure-torch `sgl_kernel` stand-in (scripts/sglang_cpu/sgl_kernel) against plain reference code.

The stand-in sits on the real SGLang server's request path on a CPU (every prefill and decode step
writes its KV slots through `assign_req_to_token_pool_cpu`), so a mistake there would corrupt the
engine's KV cache silently; these checks compare each helper with a few lines of obvious Python.

Where it runs: torch is not a harness dependency. When the harness venv has torch the checks run
in-process; otherwise they run in one subprocess of an engine venv's python: the SGLang one
(AGENTLOAD_SGLANG_PYTHON, else <repo>/.engine-venv/sglang/bin/python; scripts/setup-sglang-cpu.sh
creates it), else the vLLM one (AGENTLOAD_VLLM_PYTHON, which the CI test command sets up anyway;
it has the same CPU torch). Every mode imports the stand-in from this checkout's scripts/, not a
venv's installed copy. With none available the tests skip and say why.

Run as a script (`python tests/unit/harness/test_sgl_kernel_standin.py`) it executes every check and prints one
JSON object {check: "ok" | traceback}; that is what the subprocess mode calls.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

# Not support.paths: run as a script under an engine venv's python (the subprocess mode), this file
# has only its own folder on sys.path, so it finds the repository from where it sits.
REPO = Path(__file__).resolve().parents[3]
STANDIN_DIR = REPO / "scripts" / "sglang_cpu"

# Every name SGLang 0.5.22 imports from sgl_kernel on its CPU engine path (module level).
IMPORTED_NAMES = (
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
)
SPECULATIVE = (*IMPORTED_NAMES[2:], "build_draft_decode_metadata_cpu")


def _standin():
    if str(STANDIN_DIR) not in sys.path:
        sys.path.insert(0, str(STANDIN_DIR))
    import sgl_kernel

    if Path(sgl_kernel.__file__).resolve().parent != (STANDIN_DIR / "sgl_kernel").resolve():
        raise AssertionError(f"imported {sgl_kernel.__file__}, not this checkout's stand-in")
    return sgl_kernel


# ----------------------------------------------------------------------------------------------
# checks (need torch; each raises on failure)
# ----------------------------------------------------------------------------------------------
def _ref_assign(req_to_token, rows, starts, ends, locs):
    out = req_to_token.clone()
    k = 0
    for r, lo, hi in zip(rows, starts, ends):
        for col in range(lo, hi):
            out[r, col] = int(locs[k])
            k += 1
    return out


def check_imported_names() -> None:
    sk = _standin()
    missing = [n for n in IMPORTED_NAMES if not callable(getattr(sk, n, None))]
    assert not missing, f"missing: {missing}"


def check_no_torch_ops_registered() -> None:
    """SGLang treats `torch.ops.sgl_kernel.convert_weight_packed` as 'the AMX kernels are here'."""
    import torch

    _standin()
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    assert not hasattr(torch.ops.sgl_kernel, "rmsnorm_cpu")


def check_assign_req_to_token_pool() -> None:
    import torch

    sk = _standin()
    g = torch.Generator().manual_seed(0)
    pool_len = 40
    for trial in range(30):
        n_rows = 8
        table = torch.randint(0, 1000, (n_rows, pool_len), generator=g, dtype=torch.int32)
        bs = int(torch.randint(1, 6, (1,), generator=g))
        rows = torch.randperm(n_rows, generator=g)[:bs]
        starts = torch.randint(0, pool_len, (bs,), generator=g)
        lens = torch.randint(0, 12, (bs,), generator=g)
        if trial == 0:
            lens[0] = 0  # an empty span consumes nothing
        ends = torch.minimum(starts + lens, torch.tensor(pool_len))
        total = int((ends - starts).sum())
        locs = torch.randint(0, 1 << 20, (total + 3,), generator=g, dtype=torch.int64)  # spare tail unused
        want = _ref_assign(table, rows.tolist(), starts.tolist(), ends.tolist(), locs.tolist())
        got = table.clone()
        sk.assign_req_to_token_pool_cpu(rows, got, starts, ends, locs, pool_len)
        assert torch.equal(got, want), f"trial {trial}"
        assert got.dtype == torch.int32


def check_assign_rejects_short_locs() -> None:
    import torch

    sk = _standin()
    table = torch.zeros((2, 8), dtype=torch.int32)
    try:
        sk.assign_req_to_token_pool_cpu(
            torch.tensor([0]), table, torch.tensor([0]), torch.tensor([4]), torch.arange(3), 8
        )
    except IndexError:
        return
    raise AssertionError("3 locations for a 4-token span were accepted")


def _kv_buffers(torch, rows: int):
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn((rows, 2, 32), generator=g).to(torch.bfloat16),  # K, layer 0
        torch.randn((rows, 2, 32), generator=g).to(torch.bfloat16),  # K, layer 1
        torch.randn((rows, 2, 16), generator=g),  # V with another head dim, float32
        torch.randint(0, 255, (rows, 3), generator=g, dtype=torch.uint8),  # an odd row size
    ]


def _ptrs_and_strides(torch, bufs):
    """As SGLang builds them: uint64 base addresses, row strides in bytes."""
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    return ptrs, strides


def check_copy_all_layer_kv_cache() -> None:
    import torch

    sk = _standin()
    rows = 64
    g = torch.Generator().manual_seed(2)
    cases = [
        (torch.tensor([10, 11, 12]), torch.tensor([1, 2, 3])),  # disjoint moves
        (torch.tensor([5, 6]), torch.tensor([6, 5])),  # a swap: gather before scatter
        (torch.tensor([7, 8, 9]), torch.tensor([6, 7, 8])),  # a shift onto its own sources
        (torch.tensor([4, 4]), torch.tensor([4, 4])),  # self-copies change nothing
        (torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)),
        (torch.randperm(rows, generator=g)[:20], torch.randperm(rows, generator=g)[:20]),
    ]
    for i, (tgt, src) in enumerate(cases):
        bufs = _kv_buffers(torch, rows)
        want = [b.clone() for b in bufs]
        for w in want:
            w[tgt] = w[src]  # the reference: gather then scatter (advanced indexing)
        ptrs, strides = _ptrs_and_strides(torch, bufs)
        sk.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
        for j, (b, w) in enumerate(zip(bufs, want)):
            assert torch.equal(b, w), f"case {i}, buffer {j}"


def check_copy_warmup_call() -> None:
    """SGLang's warm-up copies slot 0 onto itself with int64 location tensors."""
    import torch

    sk = _standin()
    bufs = _kv_buffers(torch, 8)
    before = [b.clone() for b in bufs]
    ptrs, strides = _ptrs_and_strides(torch, bufs)
    zero = torch.zeros(256, dtype=torch.int64)
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, zero[:1], zero[:1])
    assert all(torch.equal(b, w) for b, w in zip(bufs, before))


def check_speculative_helpers_refuse() -> None:
    sk = _standin()
    for name in SPECULATIVE:
        try:
            getattr(sk, name)(1, 2, x=3)
        except NotImplementedError as exc:
            assert name in str(exc)
        else:
            raise AssertionError(f"{name} did not raise")


CHECKS: dict[str, Callable[[], None]] = {
    name[len("check_") :]: fn for name, fn in list(globals().items()) if name.startswith("check_") and callable(fn)
}


def run_all() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            out[name] = "ok"
        except BaseException:
            out[name] = traceback.format_exc()
    return out


# ----------------------------------------------------------------------------------------------
# pytest side
# ----------------------------------------------------------------------------------------------
def _engine_python() -> str | None:
    """A python that has torch: the SGLang engine venv's, else the vLLM engine venv's (CI sets that
    one up for the real-vLLM tests; the stand-in needs nothing but torch)."""
    env = os.environ.get("AGENTLOAD_SGLANG_PYTHON")
    if env:
        return env
    default = REPO / ".engine-venv" / "sglang" / "bin" / "python"
    if default.exists():
        return str(default)
    return os.environ.get("AGENTLOAD_VLLM_PYTHON") or None


if __name__ != "__main__":
    import pytest

    @pytest.fixture(scope="module")
    def results() -> dict[str, str]:
        if importlib.util.find_spec("torch") is not None:
            return run_all()
        python = _engine_python()
        if python is None:
            pytest.skip(
                "no torch here and no engine venv: set AGENTLOAD_SGLANG_PYTHON "
                "(scripts/setup-sglang-cpu.sh prints it) or AGENTLOAD_VLLM_PYTHON to check the sgl_kernel stand-in"
            )
        if not Path(python).exists():
            pytest.fail(f"engine python {python} does not exist")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(
            [python, str(Path(__file__).resolve())],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=str(REPO),
        )
        if proc.returncode != 0:
            pytest.fail(f"{python} could not run the checks (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    @pytest.mark.parametrize("check", sorted(CHECKS))
    def test_standin(results: dict[str, str], check: str) -> None:
        assert results.get(check) == "ok", results.get(check, "check did not run")


if __name__ == "__main__":
    print(json.dumps(run_all()))
