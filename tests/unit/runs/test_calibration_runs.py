"""The calibration's run directories never collide, and a taken one is refused before the first run.

Why these exist: `calibrate e0a --n 64` shared its directory with the default saturation check at
n = 64, and after the whole E0a had run on the engine the check crashed on the directory its
seed-0 run had just filled ("already holds a run"). The simulator engine takes the same paths as
a real one (the same run list, the same directories, the same check), so these need no engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from analysis.calibration_summaries import load_summary
from cli.main import main
from harness.config import CellConfig, WorkloadConfig, load_config
from harness.errors import ConfigError
from runs.calibration import calibrate_all, e0a, stage_c

WL = WorkloadConfig(
    name="tiny",
    first_prompt=256,
    tool_tokens=64,
    decode_tokens=8,
    turns={"mean": 3.0, "cap": 5},
    tool_time={"mean": 0.2},
)
FAST = {"warmup": 4.0, "window": 8.0}


def fast_cell() -> CellConfig:
    """The CPU cell's engine settings in the simulator (only the mechanics matter here)."""
    return load_config("cells/vllm-cpu-tiny-131k", CellConfig).model_copy(
        update={"kv_pool_tokens": 8192, "context_length": 4096}
    )


def _files(tmp_path: Path) -> tuple[Path, Path]:
    cell, wl = tmp_path / "cell.yaml", tmp_path / "wl.yaml"
    cell.write_text(yaml.safe_dump(fast_cell().model_dump(mode="json"), sort_keys=False))
    wl.write_text(yaml.safe_dump(WL.model_dump(mode="json"), sort_keys=False))
    return cell, wl


def _calibrate(cell: Path, wl: Path, out: Path, stage: str, *extra: str) -> int:
    common = ["--cell", str(cell), "--workload", str(wl), "--out", str(out), "--engine", "sim"]
    return main(["calibrate", stage, *common, "--warmup", "4", "--window", "8", *extra])


def test_e0a_at_the_default_check_population_runs_once_and_checks_with_that_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell, wl = _files(tmp_path)
    out = tmp_path / "out"
    assert _calibrate(cell, wl, out, "e0a", "--n", "64", "--seeds", "0,1") == 0  # the default --check-n is 64
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["e0a-n64-s0", "e0a-n64-s1"]
    check = json.loads((out / "e0a.json").read_text())["result"]["check"]
    assert check["n"] == 64 and check["seed"] == 0  # the seed-0 run at n = 64 is the check
    assert "check n=64" in capsys.readouterr().out


def test_e0a_check_is_the_first_seeds_run_in_the_summary(tmp_path: Path) -> None:
    per_seed: list = []
    s = e0a(fast_cell(), WL, seeds=(0, 1), n=4, check_n=4, out_dir=tmp_path, runs=per_seed, **FAST)
    assert s.check == per_seed[0] and s.check.n == 4
    apart = e0a(fast_cell(), WL, seeds=(0, 1), n=4, check_n=6, out_dir=tmp_path / "apart", **FAST)
    assert apart.check is not None and apart.check.n == 6 and (tmp_path / "apart" / "e0a-n6-s0").is_dir()


def test_calibrate_all_with_the_check_at_the_e0a_population_lists_each_run_once(tmp_path: Path) -> None:
    out = tmp_path / "in"
    kw = {"ns": (4,), "e0a_seeds": (0, 1), "e0a_n": 4, "check_n": 4, "grid": (0.5,), "e0b_protocol_ref": "e0b-cpu"}
    calibrate_all(fast_cell(), WL, out, top_rate=40.0, e0b_duration=12.0, rise_span=6.0, **kw, **FAST)
    ea = load_summary(out / "e0a.yaml", "e0a")
    assert [d.path for d in ea.run_dirs] == ["runs/e0a-n4-s0", "runs/e0a-n4-s1"]
    assert ea.check is not None and ea.check == ea.per_seed[0]
    # everything recorded: a resumed calibration summarises every run (E0b's at the lambda_ref of
    # the resumed E0a) and writes the same summaries
    before = {p: (out / p).read_bytes() for p in ("stage-c.yaml", "e0a.yaml", "e0b.yaml")}
    calibrate_all(fast_cell(), WL, out, top_rate=40.0, e0b_duration=12.0, rise_span=6.0, resume=True, **kw, **FAST)
    assert {p: (out / p).read_bytes() for p in before} == before


def test_a_taken_directory_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cell, wl = _files(tmp_path)
    out = tmp_path / "out"
    (out / "e0a-n4-s2").mkdir(parents=True)
    (out / "e0a-n4-s2" / "meta.json").write_text('{"status": "FAILED"}')
    rc = _calibrate(cell, wl, out, "e0a", "--n", "4", "--check-n", "0")
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "internal error" not in err
    assert f"{out / 'e0a-n4-s2'}: already holds a run (FAILED) where the E0a run n=4 seed 2 would record" in err
    assert "nothing was run" in err and len(err.strip().splitlines()) == 1
    assert not (out / "e0a-n4-s0").exists() and not (out / "e0a-n4-s1").exists()  # refused before the first run
    # with --resume, a run that is not a COMPLETED run of these settings is refused the same way
    rc = _calibrate(cell, wl, out, "e0a", "--n", "4", "--check-n", "0", "--resume")
    err = capsys.readouterr().err
    assert rc == 2 and "holds a FAILED run that is not the E0a run n=4 seed 2" in err
    assert not (out / "e0a-n4-s0").exists()


def test_two_runs_in_one_directory_are_refused_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"stage-c-n4-s0: the Stage C run n=4 seed 0 and the Stage C run n=4 seed 0"):
        stage_c(fast_cell(), WL, (4, 8, 4), out_dir=tmp_path, **FAST)
    assert not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=r"e0a-n4-s1: the E0a run n=4 seed 1 and the E0a run n=4 seed 1"):
        e0a(fast_cell(), WL, seeds=(0, 1, 1), n=4, check_n=None, out_dir=tmp_path, **FAST)
    assert not any(tmp_path.iterdir())


def test_calibrate_all_refuses_recorded_e0b_runs_a_new_e0a_would_orphan_before_stage_c(tmp_path: Path) -> None:
    out = tmp_path / "in"
    kw = {"ns": (4,), "e0a_seeds": (0,), "e0a_n": 4, "check_n": None, "grid": (0.5,), "e0b_protocol_ref": "e0b-cpu"}
    calibrate_all(fast_cell(), WL, out, top_rate=40.0, e0b_duration=12.0, rise_span=6.0, **kw, **FAST)
    for d in (out / "runs").glob("e0a-*"):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    for d in (out / "runs").glob("stage-c-*"):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    with pytest.raises(ConfigError, match=r"e0b-m0\.5-s0: holds a COMPLETED run that is not the E0b run at 0\.5 x"):
        calibrate_all(fast_cell(), WL, out, top_rate=40.0, e0b_duration=12.0, rise_span=6.0, resume=True, **kw, **FAST)
    assert not list((out / "runs").glob("stage-c-*")) and not list((out / "runs").glob("e0a-*"))  # nothing ran


def test_one_stage_writes_its_summary_in_the_registrations_input_format(tmp_path: Path) -> None:
    """`calibrate stage-c` and `calibrate e0a` on their own write stage-c.yaml and e0a.yaml as
    `calibrate all` does: a cell calibrated stage by stage still gets the inputs the cell's
    references and `prereg` read, each run directory bound by hash, and the same numbers as the
    stage's JSON result."""
    from analysis.calibration_summaries import E0a, StageC, e0a_values

    cell, wl = _files(tmp_path)
    out = tmp_path / "out"
    assert _calibrate(cell, wl, out, "stage-c", "--n", "4,8") == 0
    assert _calibrate(cell, wl, out, "e0a", "--n", "4", "--seeds", "0,1", "--check-n", "8") == 0
    sc = load_summary(out / "stage-c.yaml", "stage-c")
    assert isinstance(sc, StageC) and [p.n for p in sc.points] == [4, 8]
    assert [d.path for d in sc.run_dirs] == ["stage-c-n4-s0", "stage-c-n8-s0"]
    ea = load_summary(out / "e0a.yaml", "e0a")
    assert isinstance(ea, E0a) and [r.seed for r in ea.per_seed] == [0, 1] and ea.check is not None
    assert [d.path for d in ea.run_dirs] == ["e0a-n4-s0", "e0a-n4-s1", "e0a-n8-s0"]
    result = json.loads((out / "e0a.json").read_text())["result"]
    values = e0a_values(ea, "e0a.yaml")
    assert values.lambda_ref == pytest.approx(result["lambda_ref"], rel=1e-12)
    assert values.all_miss_token_rate == pytest.approx(result["all_miss_token_rate"], rel=1e-12)
