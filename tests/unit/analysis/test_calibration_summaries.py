"""Calibration summaries: malformed inputs are refused naming file, field, value and expectation."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

from analysis.calibration_summaries import InputError, dir_sha256, e0a_values, load_inputs, load_summary

ROOT = REPO
PAPER = ROOT / "prereg" / "inputs" / "paper" / "sglang-a100-300k"


def _edit(tmp_path: Path, name: str, fn: Callable[[dict], None]) -> Path:
    d = tmp_path / "in"
    shutil.copytree(PAPER, d)
    p = d / name
    data = yaml.safe_load(p.read_text())
    fn(data)
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return d


CASES = [
    ("stage-c.yaml", lambda d: d["points"][2].pop("n"), r"points\[2\]\.n: required field is missing"),
    (
        "stage-c.yaml",
        lambda d: d["points"][1].update(mu_sessions=-0.2),
        r"points\[1\]\.mu_sessions: got -0\.2; expected .*greater than or equal to 0",
    ),
    (
        "stage-c.yaml",
        lambda d: d["points"][3].update(n=20),
        r"points\[3\]\.n: got 20 after n = 24 .*expected n strictly increasing",
    ),
    ("stage-c.yaml", lambda d: d.update(colour="blue"), r"colour: unknown key \(value 'blue'\)"),
    ("stage-c.yaml", lambda d: d["points"][0].update(mu_sesions=0.1), r"points\[0\]\.mu_sesions: unknown key"),
    ("e0b.yaml", lambda d: d["points"].pop(2), r"no run at multiple 1\.75 for seed 0; .*the grid has a hole"),
    (
        "e0b.yaml",
        lambda d: d.update(grid=[1.25, 1.5, 2.0, 1.75, 2.5, 3.0]),
        r"grid\[3\]: got 1\.75 after 2\.0; expected a strictly increasing grid",
    ),
    (
        "e0b.yaml",
        lambda d: d["points"][0].update(multiple=-1.25),
        r"points\[0\]\.multiple: got -1\.25; expected .*greater than 0",
    ),
    (
        "e0b.yaml",
        lambda d: d["points"][4].update(stable=True),
        r"points\[4\]\.stable: got True; expected False by the rule",
    ),
    (
        "e0b.yaml",
        lambda d: d["points"][0].update(multiple=1.3),
        r"points\[0\]\.multiple: got 1\.3; expected one of the grid",
    ),
    ("e0b.yaml", lambda d: d.update(seeds=[0, 1]), r"no run at multiple 1\.25 for seed 1"),
    (
        "e0a.yaml",
        lambda d: d.update(lambda_ref=0.08),
        r"lambda_ref: got 0\.08; expected the mean of per_seed\.mu_turns = 0\.0715333",
    ),
    (
        "e0a.yaml",
        lambda d: d["per_seed"][1].update(uncached_token_rate=-5.0),
        r"per_seed\[1\]\.uncached_token_rate: got -5\.0",
    ),
    ("e0a.yaml", lambda d: d.update(stage="e0b"), r"stage: got 'e0b'; expected 'e0a' for a file named e0a\.yaml"),
    ("e0a.yaml", lambda d: d.update(format="other"), r"format: got 'other'; expected 'agentload-calibration'"),
]


@pytest.mark.parametrize("name,edit,pattern", CASES, ids=[c[2][:40] for c in CASES])
def test_malformed_input_is_refused(tmp_path: Path, name: str, edit: Callable[[dict], None], pattern: str) -> None:
    d = _edit(tmp_path, name, edit)
    with pytest.raises(InputError) as exc:
        load_inputs(d)
    msg = str(exc.value)
    assert str(d / name) in msg, msg
    assert re.search(pattern, msg), msg


def test_partial_grid_above_the_first_unstable_is_allowed(tmp_path: Path) -> None:
    """The vLLM fill used five of six runs: missing runs above the first unstable one are fine."""
    d = _edit(tmp_path, "e0b.yaml", lambda x: x["points"].pop(5))
    assert len(load_inputs(d).e0b.points) == 5


def test_missing_file(tmp_path: Path) -> None:
    d = tmp_path / "in"
    shutil.copytree(PAPER, d)
    (d / "e0b.yaml").unlink()
    with pytest.raises(InputError, match=r"e0b\.yaml: missing; expected the e0b summary"):
        load_inputs(d)


def test_summaries_computed_from_rows_when_absent(tmp_path: Path) -> None:
    def drop(d: dict) -> None:
        for k in ("lambda_ref", "lambda_ref_se", "lambda_sessions", "all_miss_token_rate"):
            d.pop(k)

    d = _edit(tmp_path, "e0a.yaml", drop)
    e = load_summary(d / "e0a.yaml", "e0a")
    v = e0a_values(e, "e0a.yaml")  # type: ignore[arg-type]
    assert v.lambda_ref == pytest.approx(0.0715333, abs=1e-6) and v.lambda_ref_se == pytest.approx(0.0038, abs=5e-5)
    assert v.all_miss_token_rate == pytest.approx(11243.3, abs=0.1) and "lambda_ref" in v.computed


def test_dir_hash_changes_with_any_file(tmp_path: Path) -> None:
    d = tmp_path / "run"
    (d / "sub").mkdir(parents=True)
    (d / "meta.json").write_text("{}")
    (d / "sub" / "x").write_bytes(b"1")
    h = dir_sha256(d)
    (d / "sub" / "x").write_bytes(b"2")
    assert dir_sha256(d) != h
