"""The trap on the real CPU SGLang, recomputed from its committed records (docs/sglang-cpu-trap.md).

evidence/sglang-cpu-16k-trap/test/runs/ holds the two runs made by hand on the speed-pinned cell
sglang-cpu-tiny-16k (BURST and NOBURST at 1.25 and 1.5 x lambda_ref, seeds 0-2, the test
configs/tests/sglang-cpu-16k-trap.yaml). What the docs say of them must follow from the records by
the rule, not from the docs: each run's state is judged again here by `agentload analyze` with the
test's rule and the cell's E0a references, and the references the runs were judged with at the time
(meta.json) must be the cell's today. No engine; a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from analysis.calibration_summaries import E0a, e0a_values, load_summary
from cli.main import main
from harness.config import CellConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "evidence" / "sglang-cpu-16k-trap" / "test" / "runs"
TEST = ROOT / "configs" / "tests" / "sglang-cpu-16k-trap.yaml"
CELL = "sglang-cpu-tiny-16k"


def test_the_sglang_cpu_trap_runs_are_in_their_states_by_the_rule(tmp_path: Path) -> None:
    """The states docs/sglang-cpu-trap.md reports, recomputed: BURST trapped and NOBURST good on seed 1
    at 1.25 (the by-hand demonstration), and the rest of the 2 x 3 seeds as they fell (BURST's token
    rate under the rule's band at 1.5; two BURST runs escaped the trap)."""
    out = tmp_path / "analysis"
    # a paired test's analyze exits 0 only on PASS (analysis/judge.py exit_status)
    assert main(["analyze", "--test", str(TEST), str(RUNS), "--out", str(out)]) == 1
    verdict = orjson.loads((out / "verdict.json").read_bytes())
    assert verdict["rule"] == "e2-cpu-sglang-16k"
    states = {r["rate"]: r["seeds"] for r in verdict["rates"]}
    assert states[1.25]["1"] == {"burst": "TRAPPED", "noburst": "RECOVERED"}
    assert [states[1.25][s]["burst"] for s in "012"] == ["INDETERMINATE", "TRAPPED", "RECOVERED"]
    assert [states[1.5][s]["burst"] for s in "012"] == ["RECOVERED", "INDETERMINATE", "INDETERMINATE"]
    assert all(states[r][s]["noburst"] == "RECOVERED" for r in (1.25, 1.5) for s in "012")
    assert [r["verdict"] for r in verdict["rates"]] == ["FAIL", "FAIL"] and verdict["verdict"] == "FAIL"


def test_the_runs_were_judged_with_the_cells_e0a_references_under_its_pin() -> None:
    cell = load_config(f"cells/{CELL}", CellConfig)
    summary = load_summary(ROOT / "prereg" / "inputs" / CELL / "e0a.yaml", "e0a")
    assert isinstance(summary, E0a)
    e0a = e0a_values(summary, CELL)
    assert (cell.lambda_ref, cell.all_miss_token_rate) == (e0a.lambda_ref, e0a.all_miss_token_rate)
    pin = cell.engine_speed_pin
    assert pin is not None
    for run in sorted(RUNS.iterdir()):
        meta = orjson.loads((run / "meta.json").read_bytes())
        assert meta["status"] == "COMPLETED" and meta["cell"]["name"] == CELL, run.name
        assert meta["references"]["lambda_ref"] == e0a.lambda_ref, run.name
        assert meta["references"]["all_miss_token_rate"] == e0a.all_miss_token_rate, run.name
        speed = meta["engine_speed_pin"]
        assert speed["pinned"] and abs(speed["ratio"] - 1) <= pin.tolerance, run.name
