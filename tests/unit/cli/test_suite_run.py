"""`agentload test run A.yaml B.yaml`: several tests in one worker pool give each test what a run
of it alone gives (records, verdict), in <out>/<test name>/, and refuse what fits one test only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import main as cli

PROTOCOL = (
    "kind: protocol\nname: tiny\nduration: 1500.0\nburst: {time: 200.0, size: 20, width: 20.0}\n"
    "window: {start: 800.0, end: 1500.0}\nmin_window: 600.0\n"
)


def _test(folder: Path, name: str, seeds: str) -> Path:
    (folder / "protocols").mkdir(exist_ok=True)
    (folder / "protocols" / "tiny.yaml").write_text(PROTOCOL)
    p = folder / f"{name}.yaml"
    p.write_text(
        f"kind: test\nname: {name}\ncell: sglang-a100-300k\nworkload: standard\nprotocol: protocols/tiny.yaml\n"
        f"arms: [burst, noburst, capped]\nrates: [1.35]\nseeds: {seeds}\ncap: 5\n"
    )
    return p


def _verdict(folder: Path) -> dict:
    v = json.loads((folder / "verdict.json").read_text())
    for r in v.get("runs", []):
        for sect in ("stats", "quantities"):
            (r.get(sect) or {}).pop("wall_s", None)
        r.pop("run_dir", None)
    v["runs"] = sorted(v.get("runs", []), key=lambda r: (r["arm"], r["seed"]))
    return v


def test_two_tests_in_one_pool_give_what_each_gives_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _test(tmp_path, "tiny-a", "[0, 1]"), _test(tmp_path, "tiny-b", "[2]")
    code = cli.main(
        ["test", "run", str(a), str(b), "--engine", "sim", "--jobs", "2", "--plain", "--out", str(tmp_path / "suite")]
    )
    out = capsys.readouterr().out
    assert code in (0, 1)  # a verdict each (PASS or FAIL), not a crash
    assert "[9/9]" in out and "== tiny-a: 6 runs, 0 not completed" in out and "== tiny-b: 3 runs" in out
    suite = tmp_path / "suite"
    assert json.loads((suite / "wall.json").read_text())["runs"] == 9
    alone = tmp_path / "alone"
    cli.main(["test", "run", str(a), "--engine", "sim", "--jobs", "2", "--plain", "--out", str(alone)])
    assert _verdict(suite / "tiny-a") == _verdict(alone)
    for run in ("burst-r1.35-s0", "noburst-r1.35-s1", "capped-r1.35-s0"):
        for table in ("turns.parquet", "sessions.parquet", "gauges.parquet"):
            assert (suite / "tiny-a" / run / table).read_bytes() == (alone / run / table).read_bytes()
    assert (suite / "tiny-b" / "verdict.json").exists() and (suite / "tiny-b" / "report.md").exists()
    assert json.loads((suite / "tiny-b" / "wall.json").read_text())["runs"] == 3


def test_one_test_options_are_refused_for_several(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _test(tmp_path, "tiny-a", "[0]"), _test(tmp_path, "tiny-b", "[1]")
    code = cli.main(["test", "run", str(a), str(b), "--engine", "sim", "--rule", "e2", "--out", str(tmp_path / "o")])
    assert code != 0 and "--rule applies to one test" in capsys.readouterr().err
    code = cli.main(["test", "run", str(a), str(a), "--engine", "sim", "--out", str(tmp_path / "o2")])
    assert code != 0 and "tiny-a given more than once" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2" / "tiny-a").exists()
