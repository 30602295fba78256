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
    rate under the rule's band at 1.5). The two BURST runs that escaped the trap were played by an
    engine whose after-run recheck read 1.43 and 1.40 x the pinned speed: the rule (version 2) does
    not count them, so their seeds are undecided (NOT-COUNTED, with the condition that failed), 1.25 is
    INCOMPLETE rather than FAIL, and 1.5 still FAILs on its two counted INDETERMINATE seeds."""
    out = tmp_path / "analysis"
    # a paired test's analyze exits 0 only on PASS (analysis/judge.py exit_status)
    assert main(["analyze", "--test", str(TEST), str(RUNS), "--out", str(out)]) == 1
    verdict = orjson.loads((out / "verdict.json").read_bytes())
    assert verdict["rule"] == "e2-cpu-sglang-16k"
    states = {r["rate"]: r["seeds"] for r in verdict["rates"]}
    assert states[1.25]["1"] == {"burst": "TRAPPED", "noburst": "RECOVERED"}
    assert [states[1.25][s]["burst"] for s in "012"] == ["INDETERMINATE", "TRAPPED", "NOT-COUNTED"]
    assert [states[1.5][s]["burst"] for s in "012"] == ["NOT-COUNTED", "INDETERMINATE", "INDETERMINATE"]
    assert all(states[r][s]["noburst"] == "RECOVERED" for r in (1.25, 1.5) for s in "012")
    assert [r["verdict"] for r in verdict["rates"]] == ["INCOMPLETE", "FAIL"] and verdict["verdict"] == "FAIL"
    runs = {(r["arm"], r["rate"], r["seed"]): r for r in verdict["runs"]}
    for key, after in ((("burst", 1.25, 2), 1.434), (("burst", 1.5, 0), 1.397)):
        meta = orjson.loads((RUNS / f"BURST-r{key[1]:g}-s{key[2]}" / "meta.json").read_bytes())
        assert round(meta["engine_speed_pin"]["after"]["ratio"], 3) == after  # what the recheck read
        assert "abs(pin_after - 1) <= recheck_tolerance" in runs[key]["reason"], runs[key]
    # every counted run's speed held within the band (0.87-1.07 x the target after the run)
    assert sum(1 for r in verdict["runs"] if r["state"] != "NOT-COUNTED") == 10


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
