"""The cost fit from what a user has: per-request timings with the per-request term, the calibration
summaries alone, both jointly; the sources' hashes in the cost file; refusals for missing inputs.

The "real" engine here is the engine model itself with known costs (TRUE): its summaries and its
timings are what a fit must give those costs back from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from support.sim2real_cells import closed_cell

from analysis.calibration_summaries import (
    E0a,
    StageC,
    dir_sha256,
    e0a_summary_dict,
    load_summary,
    stage_c_summary,
    write_summary,
)
from harness.config import CellConfig, WorkloadConfig
from harness.config.models import CostConfig
from runs.closed_runs import e0a as run_e0a
from runs.closed_runs import run_closed
from runs.closed_runs import stage_c as run_stage_c
from sim2real.costfit import CostFitError, fit_from_runs, rows_from_runs
from sim2real.summaryfit import Simulator, cost_start, fit_summaries, summary_points, timing_start

TRUE = {"a": 4e-3, "f0": 0.0, "b": 3e-6, "c_p": 2e-10, "chunk": 8192, "c_d": 1e-3, "c_r": 2e-3}
NS = (4, 8, 12)
TIMES = (2.0, 20.0)  # warm-up, window of the summaries' closed runs

WL = WorkloadConfig(
    name="w", first_prompt=512, tool_tokens=128, decode_tokens=8, turns={"mean": 8, "cap": 20}, tool_time={"mean": 0.1}
)


def _cell(cost: dict[str, float] | None = None, **kw: object) -> CellConfig:
    return closed_cell(cost or TRUE, max_running=16, prefix_cache=True, **kw)


def _summaries(folder: Path) -> tuple[StageC, E0a]:
    """stage-c.yaml and e0a.yaml of the engine with the TRUE costs."""
    folder.mkdir(parents=True, exist_ok=True)
    cell = _cell()
    stats = run_stage_c(cell, WL, NS, seeds=(0,), warmup=TIMES[0], window=TIMES[1])
    write_summary(
        stage_c_summary("t", stats, warmup=TIMES[0], window=TIMES[1], run_dirs=[], folder=folder, source="test"),
        folder / "stage-c.yaml",
    )
    per_seed: list[object] = []
    e = run_e0a(cell, WL, seeds=(0, 1), n=24, check_n=None, warmup=TIMES[0], window=TIMES[1], runs=per_seed)  # type: ignore[arg-type]
    write_summary(
        e0a_summary_dict(
            "t", per_seed, e, n=24, warmup=TIMES[0], window=TIMES[1], run_dirs=[], folder=folder, source="test"
        ),
        folder / "e0a.yaml",
    )
    sc, ea = load_summary(folder / "stage-c.yaml", "stage-c"), load_summary(folder / "e0a.yaml", "e0a")
    assert isinstance(sc, StageC) and isinstance(ea, E0a)
    return sc, ea


def _simulator() -> Simulator:
    return Simulator(_cell(), WL, TIMES, TIMES, run_stage_c, run_e0a)


def test_the_timing_fit_recovers_the_per_request_term(tmp_path: Path) -> None:
    # cached turns at small n: most of a turn's cost is the step's a and the request's c_r
    dirs = []
    for n in (4, 16):
        run_closed(_cell(), WL, n, seed=1, warmup=2, window=12, run_dir=tmp_path / f"n{n}")
        dirs.append(tmp_path / f"n{n}")
    fit = fit_from_runs(dirs, 8192)
    for k in ("a", "b", "c_d", "c_r"):
        assert fit.params[k] == pytest.approx(TRUE[k], rel=0.05), k
    assert fit.residuals["all"]["median_abs_rel"] < 0.03
    # without the term the same timings cannot be fitted as well: c_r is not a free extra knob
    no_cr = fit_from_runs(dirs, 8192, free=("a", "b", "c_p", "c_d"))
    assert no_cr.residuals["all"]["median_abs_rel"] > 2 * fit.residuals["all"]["median_abs_rel"]


def test_a_fit_from_summaries_alone_recovers_the_two_speeds(tmp_path: Path) -> None:
    sc, ea = _summaries(tmp_path / "inputs")
    points = summary_points(sc, ea)
    assert [p.label for p in points if p.fitted] == [
        "stage-c n=4 mu_turns",
        "stage-c n=8 mu_turns",
        "stage-c n=12 mu_turns",
        "e0a n=24 lambda_ref",
        "e0a n=24 all_miss_token_rate",
    ]
    # start from a wrong shape's scale: the fixed terms x2, the token terms x0.5
    wrong = {**TRUE, "a": 2 * TRUE["a"], "c_r": 2 * TRUE["c_r"], "b": TRUE["b"] / 2, "c_p": TRUE["c_p"] / 2}
    wrong["c_d"] = TRUE["c_d"] / 2
    start = cost_start(CostConfig(**wrong))
    fit = fit_summaries(points, _simulator(), start, 8192, max_evaluations=30)
    assert fit.method == "summaries" and len(fit.groups) == 2
    fixed, token = fit.multipliers
    assert fixed == pytest.approx(0.5, rel=0.1) and token == pytest.approx(2.0, rel=0.1)
    for row in fit.point_rows():
        if row["fitted"]:
            assert abs(row["rel"]) < 0.05, row


def test_a_joint_fit_and_the_sources_hashes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    _summaries(tmp_path / "inputs")
    runs = []
    for n in (4, 16):
        run_closed(_cell(), WL, n, seed=1, warmup=2, window=12, run_dir=tmp_path / f"n{n}")
        runs.append(tmp_path / f"n{n}")
    timing = rows_from_runs(runs, 8192)
    start = timing_start(timing)
    assert start["c_r"] == pytest.approx(TRUE["c_r"], rel=0.05)
    cell_file = tmp_path / "cell.yaml"
    cell_file.write_text(yaml.safe_dump({"kind": "cell", **_cell().model_dump(mode="json")}))
    wl_file = tmp_path / "wl.yaml"
    wl_file.write_text(yaml.safe_dump({"kind": "workload", **WL.model_dump(mode="json")}))
    rc = main(
        [
            "calibrate",
            "costs",
            "--engine",
            "vllm",
            "--cell",
            str(cell_file),
            "--workload",
            str(wl_file),
            "--inputs",
            str(tmp_path / "inputs"),
            "--from-runs",
            *map(str, runs),
            "--max-evaluations",
            "8",
            "--name",
            "joint",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "timings+summaries" in text and "stage-c n=8 mu_turns" in text
    doc = yaml.safe_load((tmp_path / "out" / "joint.yaml").read_text())
    fit = doc["fit"]
    assert fit["method"] == "timings+summaries" and fit["timing"]["observations"] == len(timing)
    want = {
        ("stage-c", str(tmp_path / "inputs" / "stage-c.yaml")): hashlib.sha256(
            (tmp_path / "inputs" / "stage-c.yaml").read_bytes()
        ).hexdigest(),
        ("e0a", str(tmp_path / "inputs" / "e0a.yaml")): hashlib.sha256(
            (tmp_path / "inputs" / "e0a.yaml").read_bytes()
        ).hexdigest(),
        **{("run", str(d)): dir_sha256(d) for d in runs},
    }
    assert {(s["role"], s["path"]): s["sha256"] for s in fit["sources"]} == want
    # the true costs made these data: the joint fit stays on them
    for k in ("a", "b", "c_r"):
        assert doc[k] == pytest.approx(TRUE[k], rel=0.1), k
    assert all(abs(p["rel"]) < 0.05 for p in fit["points"] if p["fitted"])


def test_the_fit_refuses_missing_inputs_with_what_it_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    (tmp_path / "empty").mkdir()
    base = ["calibrate", "costs", "--cell", "sglang-a100-300k", "--out", str(tmp_path / "o")]
    for extra, message in (
        (["--engine", "sglang", "--inputs", str(tmp_path / "empty")], "neither stage-c.yaml nor e0a.yaml is there"),
        (["--engine", "sglang"], "no per-request timings to fit; give --inputs DIR"),
        (["--engine", "vllm", "--inputs", str(tmp_path / "empty")], "is a sglang cell"),
    ):
        assert main([*base, *extra]) != 0
        assert message in capsys.readouterr().err
    with pytest.raises(CostFitError, match="no summary point to fit"):
        fit_summaries([], _simulator(), cost_start(CostConfig()), 8192)


def test_the_reference_weight_holds_e0a_against_a_stage_c_that_disagrees() -> None:
    """E0a's points (the registered references) counted `reference_weight` times: where the summaries
    disagree (a stand-in simulator in which one speed serves every point, Stage C reading 20% more
    than E0a), the fit moves toward E0a as its weight grows."""
    from sim2real.summaryfit import SummaryPoint

    class OneSpeed:
        runs = 0

        def values(self, cost: CostConfig, points: list[SummaryPoint]) -> list[float]:
            return [TRUE["a"] / cost.a for _ in points]  # every point: the engine's speed

    points = [SummaryPoint("stage-c", n, "mu_turns", 1.2, (0,), True) for n in NS] + [
        SummaryPoint("e0a", 24, m, 1.0, (0, 1), True) for m in ("lambda_ref", "all_miss_token_rate")
    ]
    start = {k: v for k, v in TRUE.items() if k != "chunk"}
    rel = {}
    for w in (1.0, 10.0):
        fit = fit_summaries(points, OneSpeed(), start, 8192, max_evaluations=30, reference_weight=w)  # type: ignore[arg-type]
        rel[w] = max(abs(r["rel"]) for r in fit.point_rows() if r["stage"] == "e0a")
    # weight 1: the speed that minimises 3 x (s/1.2 - 1)^2 + 2 x (s - 1)^2, ~1.11 (E0a 11% off); 10: ~1.03
    assert rel[1.0] == pytest.approx(0.11, abs=0.02) and rel[10.0] < 0.04, rel
    with pytest.raises(CostFitError, match="reference weight"):
        fit_summaries(points, OneSpeed(), start, 8192, reference_weight=0.0)  # type: ignore[arg-type]
