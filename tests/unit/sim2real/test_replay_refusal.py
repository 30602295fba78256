"""A replay cannot mislead: costs that are not the run's engine's on its cell are refused (with what
the run is, what the file says and what to do), --cost-from-meta replays anyway and is marked in the
report, and the parity report classes every run of a test folder and its replay by the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.sim2real_cells import short_e2_bundle

from cli.main import main
from harness.config import TestBundle
from runs.arms import execute_run
from sim2real.replay import ForeignCostError, replay_run

COST = {"a": 9.24e-3, "f0": 1.26e-3, "b": 62.6e-6, "c_p": 2.24e-9, "chunk": 8192, "c_d": 0.31e-3}


def _short_bundle() -> TestBundle:
    """The E2 SGLang test on a 700 s protocol, its rule's spans cut to fit (the runs record them)."""
    return short_e2_bundle({"min_window": 500.0, "recovered_span": 200.0})


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small test folder: NOBURST and BURST at 1.35, seed 0, simulated."""
    root = tmp_path_factory.mktemp("test-folder") / "runs"
    b = _short_bundle()
    for arm in ("noburst", "burst"):
        execute_run(b, arm, 1.35, 0, "sim", root / f"{arm}-1.35-s0")
    return root


def _as_real(run: Path, dest: Path) -> Path:
    """A copy of a simulated run whose meta.json says a real SGLang made it (what a replay reads)."""
    dest.mkdir(parents=True)
    for f in run.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    meta = json.loads((dest / "meta.json").read_text())
    meta["engine_backend"] = "sglang"
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def _cost(path: Path, **owner: object) -> Path:
    path.write_text(yaml.safe_dump({"kind": "cost", "name": path.stem, **owner, **COST}))
    return path


def test_foreign_cost_file_is_refused_naming_run_file_and_remedy(folder: Path, tmp_path: Path) -> None:
    run = folder / "burst-1.35-s0"
    foreign = _cost(tmp_path / "vllm-cpu.yaml", engine="vllm", cells=["vllm-cpu-tiny-131k"])
    with pytest.raises(ForeignCostError) as exc:
        replay_run(run, tmp_path / "r1", cost_file=foreign)
    msg = str(exc.value)
    for part in (
        "engine sglang, cell sglang-a100-300k",  # what the run is
        "engine vllm, cells ['vllm-cpu-tiny-131k']",  # what the file says
        "agentload calibrate costs --cell sglang-a100-300k --from-runs",  # what to do
        "--cost-from-meta",
    ):
        assert part in msg, part
    assert not (tmp_path / "r1").exists()  # refused before anything is written
    # the right engine but another cell, and a file that says nothing: refused too
    with pytest.raises(ForeignCostError, match="cells \\['sglang-a100-150k'\\]"):
        replay_run(
            run, tmp_path / "r2", cost_file=_cost(tmp_path / "c2.yaml", engine="sglang", cells=["sglang-a100-150k"])
        )
    with pytest.raises(ForeignCostError, match="says neither which engine nor which cell"):
        replay_run(run, tmp_path / "r3", cost_file=_cost(tmp_path / "c3.yaml"))
    # the file that names the run's engine and cell is taken, and recorded with its hash
    own = _cost(tmp_path / "own.yaml", engine="sglang", cells=["sglang-a100-300k"])
    rec = json.loads((replay_run(run, tmp_path / "r4", cost_file=own) / "meta.json").read_text())["replay_of"]
    assert rec["source"] == "file" and rec["cost_file"] == str(own) and len(rec["cost_file_sha256"]) == 64


def test_the_repository_cost_files_name_their_cells() -> None:
    from harness.config import CellConfig, cost_file_owner, load_config

    for cell_file in sorted(Path("configs/cells").glob("*.yaml")):
        raw = yaml.safe_load(cell_file.read_text())
        if not raw.get("cost_file"):
            continue
        cell = load_config(str(cell_file), CellConfig)
        engine, cells = cost_file_owner(
            raw["cost_file"], cell_file.parent if raw["cost_file"].startswith("..") else None
        )
        assert engine == cell.engine.name and cell.name in cells, cell_file


def test_a_real_run_without_cost_is_refused_unless_cost_from_meta_which_is_marked(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = _as_real(folder / "burst-1.35-s0", tmp_path / "real" / "burst-1.35-s0")
    with pytest.raises(
        ForeignCostError, match="a sglang run on engine sglang, cell sglang-a100-300k, and no cost file"
    ):
        replay_run(real, tmp_path / "r0")
    assert main(["replay", str(real), "--out", str(tmp_path / "out0")]) != 0  # refused before any replay
    assert "pass --cost-from-meta to replay" in capsys.readouterr().err
    assert not (tmp_path / "out0" / "replays").exists()
    assert main(["replay", str(real), "--cost-from-meta", "--out", str(tmp_path / "out")]) == 0
    rec = json.loads((tmp_path / "out" / "replays" / real.name / "meta.json").read_text())["replay_of"]
    assert rec["source"] == "meta" and rec["cost_file"] is None
    md = (tmp_path / "out" / "parity.md").read_text()
    assert "**Marked** (costs from the run's meta.json (--cost-from-meta)" in md and "**meta (marked)**" in md
    assert json.loads((tmp_path / "out" / "parity.json").read_text())[0]["cost_source"] == "meta"
    capsys.readouterr()
    argv = ["replay", str(real), "--cost-from-meta", "--cost", "configs/costs/sglang-a100.yaml", "--out", "x"]
    assert main(argv) != 0 and "not both" in capsys.readouterr().err


def test_parity_classes_every_run_of_a_test_folder_by_the_rule(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "parity"
    assert main(["replay", str(folder), "--out", str(out)]) == 0
    reports = json.loads((out / "parity.json").read_text())
    assert sorted(Path(r["real"]).name for r in reports) == ["burst-1.35-s0", "noburst-1.35-s0"]
    for r in reports:
        st = r["states"]
        assert st["rule"] == "e2" and st["rule_source"].startswith("named rule e2")
        assert r["cost_source"] == "run"  # a simulated run's own costs
        for side in ("real", "sim"):
            x = st[side]
            assert x["status"] == "complete" and x["state"] in ("TRAPPED", "RECOVERED", "DRAINING", "INDETERMINATE")
            assert x["token_ratio"] > 0 and 0 <= x["hit"] <= 1 and x["backlog_end"] >= 0 and x["completions_ref"] > 0
        # the same simulator with the same costs: the replay is the run, state and all
        assert st["match"] and st["real"] == st["sim"]
    by_arm = {r["arm"]: r["states"]["real"] for r in reports}
    assert by_arm["noburst"]["completions_ref"] != by_arm["burst"]["completions_ref"]  # each run is read
    md = (out / "parity.md").read_text()
    assert "## States by the registered rule" in md and "States match in 2 of 2 runs." in md


def test_a_fitted_cost_file_names_the_engine_and_cell_it_was_fitted_for(tmp_path: Path) -> None:
    from harness.config import CellConfig, WorkloadConfig, cost_file_owner, load_cost_file
    from runs.closed_runs import run_closed

    true = {"a": 4e-3, "f0": 0.0, "b": 3e-6, "c_p": 2e-10, "chunk": 8192, "c_d": 1e-3}
    cell = CellConfig(
        name="fit-cell",
        engine={"name": "vllm", "version": "0.32.0"},
        model="m",
        gpu="g",
        kv_pool_tokens=131072,
        page_size=32,
        max_running=64,
        prefix_cache=False,
        batching="mixed",
        context_length=8192,
        cost=true,
    )
    wl = WorkloadConfig(name="w", first_prompt=512, tool_tokens=128, decode_tokens=8, tool_time={"mean": 0.2})
    cell_file = tmp_path / "fit-cell.yaml"
    cell_file.write_text(yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"})))
    run_closed(cell, wl, 6, seed=1, warmup=2, window=8, run_dir=tmp_path / "n6")
    out = tmp_path / "fit"
    argv = ["calibrate", "costs", "--cell", str(cell_file), "--from-runs", str(tmp_path / "n6"), "--out", str(out)]
    assert main(argv) == 0
    path = out / "fit-cell-fitted.yaml"
    assert cost_file_owner(path) == ("vllm", ("fit-cell",))
    assert list(yaml.safe_load(path.read_text()))[:4] == ["kind", "name", "engine", "cells"]
    assert load_cost_file(path).a == pytest.approx(true["a"], rel=0.2)
