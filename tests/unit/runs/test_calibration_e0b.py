"""E0b (from-empty stability) and `calibrate all` on the simulator, in a small configuration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.paths import REPO
from support.prereg_fixture import SHORT_PROTOCOL, template_text

from analysis.calibration import e0b_stats
from analysis.calibration_summaries import dir_sha256, load_inputs
from harness.config import CellConfig, WorkloadConfig, load_config
from prereg.fill import fill_registration
from runs.calibration import calibrate_all
from runs.from_empty import e0b, run_from_empty


@pytest.fixture(scope="module")
def cell_wl() -> tuple[CellConfig, WorkloadConfig]:
    return load_config("cells/sglang-a100-300k", CellConfig), load_config("workloads/standard", WorkloadConfig)


def test_e0b_stats_reads_the_backlog_of_sessions_in_the_system() -> None:
    # one session arrives every 10 s from t = 0 and none ends: N(t) grows by 0.1 per second
    arr = np.arange(0.0, 3000.0, 10.0)
    sessions = pd.DataFrame({"arrival": arr, "end": np.full(arr.size, np.nan), "outcome": ["unfinished"] * arr.size})
    turns = pd.DataFrame({"done_time": [], "status": [], "prompt_tokens": [], "cached_tokens": []})
    s = e0b_stats(turns, sessions, multiple=2.0, seed=0, lambda_ref=0.05, duration=3000.0)
    assert s.rise == pytest.approx(0.1 * 1500, rel=1e-6)
    assert s.final_backlog == pytest.approx(300.0) and not s.stable  # the last bin [2990, 3000) holds 300
    assert s.sessions == 300 and s.realized_multiple == pytest.approx(2.0)
    # every session leaves after 100 s: a flat backlog of 10, stable
    sessions["end"] = arr + 100.0
    sessions["outcome"] = "completed"
    s = e0b_stats(turns, sessions, multiple=2.0, seed=0, lambda_ref=0.05, duration=3000.0)
    assert s.stable and abs(s.rise) < 1e-9 and s.final_backlog == pytest.approx(10.0)


def test_from_empty_runs_nest_and_separate(cell_wl) -> None:
    cell, wl = cell_wl
    # a short run cannot wait for the collapse, so the registered thresholds are scaled down with it
    low, high = e0b(cell, wl, 0.0715, grid=(0.5, 6.0), duration=600.0, rise_span=300.0, final_max=15.0)
    assert low.stable and low.final_backlog < 15
    assert not high.stable and high.final_backlog > 15 and high.max_backlog > low.max_backlog
    assert high.sessions > low.sessions  # the seed's arrivals at 0.5 are a subset of those at 4.0


def test_from_empty_run_records(tmp_path: Path, cell_wl) -> None:
    cell, wl = cell_wl
    from runs.from_empty import e0b_protocol

    prot = e0b_protocol(300.0, 150.0)
    s = run_from_empty(cell, wl, 1.0, 0.0715, protocol=prot, rise_span=150.0, run_dir=tmp_path / "r")
    from harness.recording.record import load_run

    run = load_run(tmp_path / "r")
    assert run.status == "COMPLETED" and run.meta["run_kind"] == "from_empty" and run.meta["rate"] == 1.0
    assert (tmp_path / "r" / "plan.parquet").is_file() and s.sessions == len(run.sessions)


def test_calibrate_all_then_fill_gives_a_filled_registration(tmp_path: Path, cell_wl) -> None:
    cell, wl = cell_wl
    out = tmp_path / "prereg" / "inputs" / "sim"
    b = calibrate_all(
        cell,
        wl,
        out,
        ns=(8, 16),
        e0a_seeds=(0, 1),
        e0a_n=8,
        check_n=None,
        warmup=60.0,
        window=120.0,
        grid=(0.5, 1.0, 2.0, 6.0),
        e0b_duration=300.0,
        rise_span=150.0,
        final_max=15.0,
    )
    inputs = load_inputs(out)
    for stage in ("stage-c", "e0a", "e0b"):
        model = getattr(inputs, stage.replace("-", "_"))
        assert model.run_dirs, stage
        for rd in model.run_dirs:
            assert dir_sha256(out / rd.path) == rd.sha256
    assert inputs.e0a.lambda_ref == pytest.approx(b.e0a.lambda_ref)
    assert inputs.e0b.lambda_ref == pytest.approx(b.e0a.lambda_ref)
    assert [p.multiple for p in inputs.e0b.points] == [0.5, 1.0, 2.0, 6.0]
    assert inputs.e0b.points[-1].stable is False  # 6 x lambda_ref cannot be held from empty
    tdir = tmp_path / "prereg" / "templates"
    tdir.mkdir(parents=True)
    (tdir / "short.yaml").write_text(SHORT_PROTOCOL)
    (tdir / "t.yaml").write_text(template_text())
    reg = fill_registration(out, tdir / "t.yaml", repo_root=tmp_path).registration
    f = reg.fill
    assert f["measured"]["e0b"]["first_unstable"] is not None
    assert reg.status == "FILLED", reg.status_reasons
    assert all(r["inside_band"] for r in f["rates"]) and len(reg.plans) == 18
    assert [i.path for i in reg.inputs] == [
        "prereg/inputs/sim/stage-c.yaml",
        "prereg/inputs/sim/e0a.yaml",
        "prereg/inputs/sim/e0b.yaml",
    ]


def test_cli_e0b(tmp_path: Path, capsys) -> None:
    from cli.main import main

    assert (
        main(
            [
                "calibrate",
                "e0b",
                "--cell",
                "sglang-a100-300k",
                "--grid",
                "0.5,6",
                "--duration",
                "300",
                "--rise-span",
                "150",
                "--final-max",
                "15",
                "--lambda-ref",
                "0.0715",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "stable" in text and "NO" in text and "yes" in text
    assert (tmp_path / "e0b.json").is_file() and (tmp_path / "e0b-m0.5-s0" / "meta.json").is_file()


def test_sim_bundle_committed_is_consistent() -> None:
    """The committed simulator bundle reads back and its registration is its fill."""
    root = REPO
    inputs = load_inputs(root / "prereg" / "inputs" / "sim-sglang-a100-300k")
    assert len(inputs.stage_c.points) == 9 and len(inputs.e0a.per_seed) == 3 and len(inputs.e0b.points) == 6
