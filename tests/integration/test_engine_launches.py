"""Every cell's launch command, parsed by the engine's own parser inside its venv (vLLM 0.32: its server
argument parser and serve-args validation; SGLang 0.5.22: `ServerArgs` CLI parsing), compared with
the cell; and every /metrics series the gauges and the smoke test read, found in that version's
source on a code path no device condition limits (harness/servers/launchcheck.py).

Planted faults in the same driver call show the check can fail: an unknown flag, a value of the
wrong type, and a launch compared with another cell's values (a mismatch). No server starts: one
driver process per engine, about 10-20 s (the engine's import) on a 2-core machine.
"""

from __future__ import annotations

import os

import pytest

from harness.config import CONFIG_ROOT, CellConfig, load_config
from harness.servers.launchcheck import build_case, check_engine, project_cases, version_problems

PLANTED = {
    # engine: (the cell planted on, another cell of the engine whose values differ, a flag of an int field)
    "vllm": ("vllm-a100-300k", "vllm-cpu-tiny-131k", "--max-num-seqs"),
    "sglang": ("sglang-a100-300k", "sglang-a100-600k", "--max-running-requests"),
}
# fields every case must have compared (the check is not vacuous)
CORE = {
    "vllm": ("num_gpu_blocks_override", "block_size", "scheduling_policy", "max_num_batched_tokens", "max_num_seqs",
             "enable_prefix_caching", "enable_prompt_tokens_details", "max_model_len", "attention_backend"),
    "sglang": ("max_total_tokens", "page_size", "schedule_policy", "chunked_prefill_size", "max_running_requests",
               "disable_radix_cache", "enable_cache_report", "enable_metrics", "attention_backend", "context_length"),
}  # fmt: skip


def _python_or_skip(engine: str) -> str:
    skip, var = {
        "vllm": ("AGENTLOAD_SKIP_VLLM", "AGENTLOAD_VLLM_PYTHON"),
        "sglang": ("AGENTLOAD_SKIP_SGLANG", "AGENTLOAD_SGLANG_PYTHON"),
    }[engine]
    if os.environ.get(skip) == "1":
        pytest.skip(f"{skip}=1: the real-{engine} tests are skipped")
    if not os.environ.get(var):
        pytest.skip(
            f"{var} is unset: the launch check needs the {engine} engine venv (scripts/ci-engine-tests.sh sets it up)"
        )
    return os.environ[var]


@pytest.mark.parametrize(
    "engine", [pytest.param("vllm", marks=pytest.mark.vllm), pytest.param("sglang", marks=pytest.mark.sglang)]
)
def test_every_cell_launch_is_accepted_by_the_engine_and_a_planted_fault_is_not(engine: str) -> None:
    python = _python_or_skip(engine)
    cases, cells = project_cases(engine)
    assert len(cases) >= 3, (
        f"expected the project's {engine} cells (A100, H200, CPU, ...), got {[c.key for c in cases]}"
    )
    cell, other, int_flag = PLANTED[engine]
    path = CONFIG_ROOT / "cells" / f"{cell}.yaml"
    planted = [
        build_case(path, key="planted-unknown-flag", extra_args=["--no-such-flag-agentload"]),
        build_case(path, key="planted-wrong-type", extra_args=[int_flag, "many"]),
        build_case(
            path, key="planted-mismatch", expect_from=load_config(CONFIG_ROOT / "cells" / f"{other}.yaml", CellConfig)
        ),
    ]
    rep = check_engine(engine, [*cases, *planted], python=python)
    print(
        f"\n{engine} {rep.version}: {len(cases)} cells parsed; series: "
        + ", ".join(
            f"{n} ({d[0]['file']}:{d[0]['line']})" if d else f"{n} (absent)" for n, d in sorted(rep.series.items())
        )
    )
    real = [p for p in rep.problems if not p.startswith("planted-")]
    assert real == [], "\n".join(real)
    assert version_problems(engine, cells, rep.version) == []
    by_key = {c["key"]: c for c in rep.cases}
    for c in cases:
        got = by_key[c.key]
        assert got["ok"] and set(CORE[engine]) <= set(got["values"]), got
    unknown, wrong, mismatch = (by_key[p.key] for p in planted)
    assert not unknown["ok"] and "--no-such-flag-agentload" in unknown["error"], unknown
    assert not wrong["ok"] and "invalid int value: 'many'" in wrong["error"], wrong
    assert mismatch["ok"] is False and mismatch["error"] is None and mismatch["mismatches"], mismatch
    pool_field = "num_gpu_blocks_override" if engine == "vllm" else "max_total_tokens"
    assert any(m.startswith(pool_field) for m in mismatch["mismatches"]), mismatch["mismatches"]
    # every series a gauge rule reads was looked up, and the current names are defined
    assert all(
        rep.series.get(n)
        for n in (
            ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info")
            if engine == "vllm"
            else ("sglang:num_running_reqs", "sglang:token_usage", "sglang:cached_tokens_total")
        )
    )
    assert all(files for files in rep.env.values()) and rep.env, rep.env
