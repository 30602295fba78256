"""`prereg check` on a fixture repository with a bare remote: every label, every refusal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.gitfixture import git, make_repo
from support.paths import REPO
from support.prereg_fixture import write_case

from prereg.check import check_registration
from prereg.fill import fill_to_file
from prereg.registration import load_registration, registration_dict, write_registration

ROOT = REPO


@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Path, Path]:
    """A fixture repository holding a FILLED registration and its inputs, all uncommitted."""
    work, _remote = make_repo(tmp_path)
    inputs, tmpl = write_case(work)
    reg = work / "prereg" / "registrations" / "e2-test.yaml"
    fill_to_file(inputs, tmpl, reg)
    return work, reg


def _commit_all(work: Path, msg: str = "register") -> str:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", msg)
    return git(work, "rev-parse", "HEAD")


def _refusals(res) -> str:
    return "\n".join(res.refusals)


def test_labels_through_the_lifecycle(repo: tuple[Path, Path]) -> None:
    work, reg = repo
    res = check_registration(reg)
    assert not res.ok and res.label["label"] == "exploratory"
    assert "is not committed" in _refusals(res)
    commit = _commit_all(work)
    res = check_registration(reg)
    assert res.ok, res.refusals
    assert res.label["label"] == "registered" and res.git["commit"] == commit and not res.git["on_remote"]
    assert all(i.ok and i.committed_sha256 == i.registered_sha256 for i in res.inputs) and len(res.inputs) == 3
    assert res.plans["checked"] == 18 and not res.plans["mismatches"]
    git(work, "push", "-q", "origin", "main")
    res = check_registration(reg)
    assert res.ok and res.label["label"] == "pre-registered" and res.git["remote_head"] == commit
    assert res.sha256 == load_registration(reg).sha256


def test_refuses_a_hash_other_than_expected(repo: tuple[Path, Path]) -> None:
    work, reg = repo
    _commit_all(work)
    sha = load_registration(reg).sha256
    assert check_registration(reg, expect_sha256=sha).ok
    res = check_registration(reg, expect_sha256="ab" * 32)
    assert f"SHA-256 is {sha}; expected {'ab' * 32}" in _refusals(res)


def test_refuses_a_status_other_than_filled(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    inputs, tmpl = write_case(work, cell="sglang-h200-300k")
    reg = work / "prereg" / "registrations" / "h200.yaml"
    fill_to_file(inputs, tmpl, reg)
    _commit_all(work)
    res = check_registration(reg)
    assert (
        "status: INCOMPLETE (rate 1.1 (1/3 across the window) is not strictly inside the band (1.1, 1.17)"
        in _refusals(res)
    )
    assert res.label["label"] == "exploratory"


def test_refuses_an_input_changed_since_registration(repo: tuple[Path, Path]) -> None:
    work, reg = repo
    _commit_all(work)
    p = work / "prereg" / "inputs" / "sglang-a100-300k" / "stage-c.yaml"
    p.write_text(p.read_text().replace("0.2239", "0.2240"))
    res = check_registration(reg)
    text = _refusals(res)
    assert "input prereg/inputs/sglang-a100-300k/stage-c.yaml: changed since it was registered" in text
    assert "working tree has uncommitted changes" in text and res.label["label"] == "exploratory"
    _commit_all(work, "edit an input after registering")  # committing the edit does not make it registered
    res = check_registration(reg)
    assert "stage-c.yaml: changed since it was registered" in _refusals(res)


def test_refuses_inputs_not_committed_with_the_registration(repo: tuple[Path, Path]) -> None:
    work, reg = repo
    git(work, "add", str(reg.relative_to(work)))
    git(work, "commit", "-q", "-m", "registration only")
    res = check_registration(reg)
    assert "not committed at the registration's commit" in _refusals(res)


def test_refuses_a_dirty_tree_or_an_edited_registration(repo: tuple[Path, Path]) -> None:
    work, reg = repo
    _commit_all(work)
    (work / "README.md").write_text("changed\n")
    res = check_registration(reg)
    assert "working tree has uncommitted changes" in _refusals(res) and res.label["label"] == "exploratory"
    git(work, "checkout", "--", "README.md")
    reg.write_bytes(
        reg.read_bytes().replace(b"description: a test registration", b"description: a changed registration")
    )
    res = check_registration(reg)
    assert "differs from its last commit" in _refusals(res)


def test_refuses_a_plan_hash_mismatch(repo: tuple[Path, Path]) -> None:
    work, reg = repo
    data = registration_dict(load_registration(reg))
    data["plans"][0]["sha256"] = "0" * 64
    write_registration(data, reg)
    _commit_all(work)
    res = check_registration(reg)
    p = data["plans"][0]
    assert f"plan {p['arm']} x {p['rate']} seed {p['seed']}: registered SHA-256 {'0' * 64}" in _refusals(res)
    assert check_registration(reg, plans=False).ok  # the other checks pass; only the plan was wrong


def test_refuses_outside_a_repository(tmp_path: Path) -> None:
    reg = tmp_path / "r.yaml"
    shutil.copy(ROOT / "prereg" / "registrations" / "e2-sglang-a100-300k.yaml", reg)
    res = check_registration(reg, plans=False)
    assert "not in a git working tree" in _refusals(res) and res.label["label"] == "exploratory"


def test_cli_exit_status_and_json(repo: tuple[Path, Path], capsys) -> None:
    from cli.main import main

    work, reg = repo
    assert main(["prereg", "check", str(reg)]) == 1
    assert "REFUSED" in capsys.readouterr().out
    _commit_all(work)
    git(work, "push", "-q", "origin", "main")
    assert main(["prereg", "check", str(reg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["label"]["label"] == "pre-registered" and out["status"] == "FILLED"


def test_cli_fill(tmp_path: Path, capsys) -> None:
    from cli.main import main

    inputs, tmpl = write_case(tmp_path)
    out = tmp_path / "r.yaml"
    assert main(["prereg", "fill", "--inputs", str(inputs), "--test", str(tmpl), "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["status"] == "FILLED" and s["rates"] == [1.35, 1.65] and s["cap"]["cap"] == 20
    assert s["sha256"] == load_registration(out).sha256
    assert main(["prereg", "fill", "--inputs", str(tmp_path / "nowhere"), "--test", str(tmpl), "--out", str(out)]) == 2
    assert "not a folder of calibration summaries" in capsys.readouterr().err
