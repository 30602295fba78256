"""The registered E2 paired test in the simulator, one seed at the higher rate (about 20 s).

The whole test (18 runs) is the main job (`agentload test run configs/tests/e2-sglang-300k.yaml
--engine sim`, benchmarks/bench_main_job.py); this checks that one seed reproduces the paper's
qualitative outcome: BURST trapped at zero hits, NOBURST good, CAPPED recovered after its gate
drained the burst.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.rules import load_rule
from analysis.staged_analysis import analyze_staged
from harness.config import load_test
from runs.arms import execute_run

pytestmark = pytest.mark.slow


def test_e2_one_seed_at_1_65(tmp_path: Path) -> None:
    bundle = load_test("configs/tests/e2-sglang-300k.yaml")
    dirs = [execute_run(bundle, arm, 1.65, 0, "sim", tmp_path / arm).run_dir for arm in ("burst", "noburst", "capped")]
    verdict, _ = analyze_staged(dirs, load_rule("e2"), arms=["burst", "noburst", "capped"], rates=[1.65], seeds=[0])
    runs = {r["arm"]: r for r in verdict["runs"]}
    b, n, c = runs["burst"], runs["noburst"], runs["capped"]
    assert b["state"] == "TRAPPED" and b["flags"]["stuck"] and b["stats"]["followup_hit"] == 0.0
    assert 0.85 <= b["stats"]["token_ratio"] <= 1.15
    assert n["state"] == "RECOVERED" and n["stats"]["hit"] > 0.9
    assert c["state"] == "RECOVERED" and c["stats"]["gate_waited"] > 100
    # CAPPED's gate drained the burst long before the window: in the window it matches NOBURST
    assert c["stats"]["gate_last_held"] < 5700.0
    assert abs(c["stats"]["hit"] - n["stats"]["hit"]) < 0.01
