"""Which dtype a CPU engine computes fast on this host: a fact of the CPU, read from its flags.

The first CPU cells run their engine in bf16, which a CPU computes fast only with AVX-512 BF16 (the
calibrating host's). Without it, the CPU vLLM read 4,500-4,900 uncached tokens/s per CPU in bf16
and ~14,000 in fp32 (the smoke probe at 1 CPU, an AVX2-only AMD EPYC, 2026-12-05), so no quota
within a pin's 1.5 CPU reaches the 65k cell's 21,000 tokens/s in bf16 and the speed pin refuses the
host; in fp32 it pinned at 1.2-1.3 CPU. Whether a run in fp32 still meets a bf16 cell's registered
references is a separate question (docs/cpu-trap.md: with that cell's probe the trapped engine's
token rate did not carry over), so fp32 is never chosen silently: a refusal names it, and a user
adds FP32_ARGS as engine arguments, which every run records in its meta.json
(engine_launch.argv). The cell vllm-cpu-tiny-65k-fp32 is calibrated and registered in fp32 for any
host of this kind.
"""

from __future__ import annotations

from pathlib import Path

#: the engine arguments of an fp32 launch (after the cell's launch extras: the last --dtype is taken)
FP32_ARGS = ("--dtype", "float32")


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo's text (read if not given); None when unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return set(value.split())
    return None


def slow_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU lacks AVX-512 BF16, so a bf16 engine runs at about a third of fp32's speed
    (False when the flags cannot be read: judged a host of the cell's kind)."""
    flags = cpu_flags(cpuinfo)
    return flags is not None and "avx512_bf16" not in flags


def refusal_hint(argv: list[str] | tuple[str, ...], cpuinfo: str | None = None) -> str:
    """What to say after a speed pin's refusal of a bf16 launch on such a CPU ('' otherwise)."""
    dtypes = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--dtype"]
    if not dtypes or dtypes[-1] != "bfloat16" or not slow_bf16(cpuinfo):
        return ""
    return (
        "; this CPU has no AVX-512 BF16, where the engine ran ~3x faster in fp32 (add "
        "--engine-arg=--dtype --engine-arg=float32); the registered references were measured in bf16 on "
        "the cell's host, and in fp32 a trapped run's token ratio fell to 0.83-0.89 (docs/cpu-trap.md)"
    )
