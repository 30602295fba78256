"""Runs of two tests that are one simulation are played once, and the copy is what playing gives.

`agentload test run A.yaml B.yaml` (runs/shared_sims.py): test B here is the registered SGLang CPU
test under another name with one seed, so its four runs have the inputs of four of A's twelve. The
suite plays A's and copies them into B's folders; B alone plays its own. Checked: the same record
tables byte for byte (their SHA-256 in meta.json), the same verdict, meta.json naming B's test and the
shared source, and `--simulate-each` playing every run. The CPU cell's runs take ~0.2 s each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

from cli.main import main

SOURCE = REPO / "configs" / "tests" / "sglang-cpu-16k-trap.yaml"


def _twin(tmp_path: Path) -> Path:
    doc = yaml.safe_load(SOURCE.read_text())
    doc["name"] = "sglang-cpu-16k-trap-twin"
    doc["seeds"] = [1]
    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _tables(run_dir: Path) -> dict[str, str]:
    meta = json.loads((run_dir / "meta.json").read_text())
    return {t: v["sha256"] for t, v in meta["tables"].items()}


def _verdict_runs(test_dir: Path) -> list[str]:
    """Each run's judgement, less where its folder is and how long it took to write (a copy: ms)."""
    out = []
    for r in json.loads((test_dir / "verdict.json").read_text())["runs"]:
        r = {k: x for k, x in r.items() if k != "run_dir"}
        r["stats"] = {k: x for k, x in r["stats"].items() if k != "wall_s"}
        out.append(json.dumps(r, sort_keys=True))
    return sorted(out)


def test_a_run_shared_between_tests_is_the_run_played(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    twin = _twin(tmp_path)
    both, alone, each = tmp_path / "both", tmp_path / "alone", tmp_path / "each"
    main(["test", "run", str(SOURCE), str(twin), "--engine", "sim", "--jobs", "2", "--out", str(both), "--plain"])
    main(["test", "run", str(twin), "--engine", "sim", "--jobs", "2", "--out", str(alone), "--plain"])

    wall = json.loads((both / "wall.json").read_text())
    assert wall["runs"] == 16 and wall["shared"] == 4, wall
    runs = sorted(p for p in (both / "sglang-cpu-16k-trap-twin").iterdir() if (p / "meta.json").exists())
    assert [p.name for p in runs] == ["burst-r1.25-s1", "burst-r1.50-s1", "noburst-r1.25-s1", "noburst-r1.50-s1"]
    for run in runs:
        meta = json.loads((run / "meta.json").read_text())
        src = both / "sglang-cpu-16k-trap" / run.name
        assert meta["test"] == "sglang-cpu-16k-trap-twin" and meta["test_file"] == str(twin)
        assert meta["shared_simulation"]["run"] == str(src)
        assert meta["shared_simulation"]["test"] == "sglang-cpu-16k-trap"
        assert meta["status"] == "COMPLETED"
        # the copy has the source's records, and they are what the twin played alone records
        assert _tables(run) == _tables(src) == _tables(alone / run.name)
        assert (run / "plan.parquet").read_bytes() == (alone / run.name / "plan.parquet").read_bytes()
        assert "shared_simulation" not in json.loads((alone / run.name / "meta.json").read_text())
    # the source test's own runs are played, not shared
    for run in (both / "sglang-cpu-16k-trap").iterdir():
        if (run / "meta.json").exists():
            assert "shared_simulation" not in json.loads((run / "meta.json").read_text())
    assert _verdict_runs(both / "sglang-cpu-16k-trap-twin") == _verdict_runs(alone)
    # `status` says which runs are copies, and the source test's none
    capsys.readouterr()
    main(["status", str(both / "sglang-cpu-16k-trap-twin"), "--json", "--no-scheduler"])
    assert json.loads(capsys.readouterr().out)["runs"]["shared"] == [p.name for p in runs]
    main(["status", str(both / "sglang-cpu-16k-trap-twin"), "--no-scheduler"])
    assert "4 of them copies of another test's run" in capsys.readouterr().out
    main(["status", str(both / "sglang-cpu-16k-trap"), "--json", "--no-scheduler"])
    assert json.loads(capsys.readouterr().out)["runs"]["shared"] == []

    main(["test", "run", str(SOURCE), str(twin), "--engine", "sim", "--out", str(each), "--plain", "--simulate-each"])
    assert json.loads((each / "wall.json").read_text())["shared"] == 0
    for run in runs:
        meta = json.loads((each / "sglang-cpu-16k-trap-twin" / run.name / "meta.json").read_text())
        assert "shared_simulation" not in meta and _tables(each / "sglang-cpu-16k-trap-twin" / run.name) == _tables(run)
