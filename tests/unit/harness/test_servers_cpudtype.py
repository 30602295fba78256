"""Which dtype a CPU engine computes fast here, from the CPU's flags, and what a speed pin's refusal
of a bf16 launch says on a CPU that lacks AVX-512 BF16."""

from __future__ import annotations

import pytest

from harness.servers.cpudtype import FP32_ARGS, cpu_flags, refusal_hint, slow_bf16

GENOA = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
MILAN = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
SKYLAKE_X = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"  # AVX-512 without BF16
BF16_LAUNCH = ["python", "-m", "vllm", "--enforce-eager", "--dtype", "bfloat16", "--kv-cache-memory-bytes", "1"]


@pytest.mark.parametrize(
    ("cpuinfo", "slow"),
    [
        (GENOA, False),
        (MILAN, True),
        (SKYLAKE_X, True),
        ("processor\t: 0\n", False),
        ("flags\t: avx2 avx512_bf16x\n", True),
    ],
    ids=["avx512-bf16", "avx2", "avx512-without-bf16", "flags-unknown", "flag-is-a-whole-word"],
)
def test_bf16_is_slow_only_without_avx512_bf16(cpuinfo: str, slow: bool) -> None:
    assert slow_bf16(cpuinfo) is slow


def test_flags_of_this_host_are_read() -> None:
    flags = cpu_flags()
    assert flags is None or "fpu" in flags  # every x86_64 /proc/cpuinfo lists the FPU


def test_a_refused_bf16_launch_on_such_a_cpu_names_fp32() -> None:
    hint = refusal_hint(BF16_LAUNCH, MILAN)
    assert "--engine-arg=--dtype --engine-arg=float32" in hint and "docs/cpu-trap.md" in hint
    assert FP32_ARGS == ("--dtype", "float32")


@pytest.mark.parametrize(
    ("argv", "cpuinfo"),
    [
        (BF16_LAUNCH, GENOA),  # the cell's kind of CPU: nothing to suggest
        ([*BF16_LAUNCH, *FP32_ARGS], MILAN),  # already fp32 (the last --dtype is the one taken)
        (["python", "-m", "sglang"], MILAN),  # no dtype on the command line
        ([], MILAN),  # an attached server: no command line
    ],
    ids=["cell-kind-cpu", "already-fp32", "no-dtype", "no-launch"],
)
def test_no_hint_where_fp32_would_change_nothing(argv: list[str], cpuinfo: str) -> None:
    assert refusal_hint(argv, cpuinfo) == ""
