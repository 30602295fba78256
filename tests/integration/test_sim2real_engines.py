"""Our engine model against the real engines' own scheduling and cache code, decision by decision.

vLLM 0.32 (its V1 Scheduler, KV cache manager and block pool, fake model outputs) needs
AGENTLOAD_VLLM_PYTHON; SGLang 0.5.22 (its radix cache, SchedulePolicy, PrefillAdder and
ScheduleBatch, SGLANG_USE_CPU_ENGINE=1) needs AGENTLOAD_SGLANG_PYTHON. Each runs the default suite
(8 trace families, one seed each) in one driver process; the import of the engine dominates (about
20-40 s on a shared 2-core machine), the whole test takes under a minute per engine.

The thresholds are the agreement measured when the model was last changed: every decision of
vLLM's agrees; for SGLang one eviction in about 560 was off by one token with identical state
afterwards (documented in docs/sim2real.md), so `evict` is held to 0.99 and the rest to 1.0.
"""

from __future__ import annotations

import os

import pytest

from sim2real.suite import run_suite, write_report
from sim2real.traces import default_suite

FLOORS = {
    "vllm": {},
    "sglang": {"evict": 0.99},
}


@pytest.mark.parametrize(
    "engine", [pytest.param("vllm", marks=pytest.mark.vllm), pytest.param("sglang", marks=pytest.mark.sglang)]
)
def test_engine_model_agrees_with_the_engines_code(engine: str, tmp_path) -> None:
    var = {"vllm": "AGENTLOAD_VLLM_PYTHON", "sglang": "AGENTLOAD_SGLANG_PYTHON"}[engine]
    skip = {"vllm": "AGENTLOAD_SKIP_VLLM", "sglang": "AGENTLOAD_SKIP_SGLANG"}[engine]
    if os.environ.get(skip) == "1":
        pytest.skip(f"{skip}=1: the real-{engine} tests are skipped")
    if not os.environ.get(var):
        pytest.skip(f"{var} is unset: the {engine} differential test needs that engine's venv python")
    summary = run_suite(engine, default_suite(seeds=1))
    print("\n" + write_report(summary, tmp_path).read_text())
    for kind, t in summary["overall"].items():
        if t["total"] == 0:
            continue
        floor = FLOORS[engine].get(kind, 1.0)
        assert t["rate"] >= floor, (
            f"{engine} {kind}: agreement {t['rate']:.4f} < {floor}; "
            f"examples: {[x for r in summary['traces'] for x in r['examples']][:5]}"
        )
    # the suite must exercise what it claims to
    ev = {
        k: sum(r["engine_events"].get(k, 0) for r in summary["traces"])
        for k in ("admitted", "finished", "evicted_blocks", "evicted_tokens", "preempted")
    }
    assert ev["admitted"] > 300 and ev["finished"] > 300
    assert (ev["evicted_blocks"] or ev["evicted_tokens"]) > 0
    if engine == "vllm":
        assert ev["preempted"] > 0
