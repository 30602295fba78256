"""`analyze --registration`: the registration's rule and references, only bound runs, and the
analysis code of the registration's commit (a temporary worktree once the checkout moves on)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import orjson
import pytest
from support.gitfixture import git, make_repo
from support.paths import REPO
from support.prereg_fixture import write_case

from prereg.fill import fill_to_file
from prereg.registration import load_registration
from provenance.codepaths import CODE_DIRS
from review.registered import RegisteredAnalysisError, registered_analysis
from runs.arms import execute_run, run_name

ROOT = REPO
CODE = (*(d.rstrip("/") for d in CODE_DIRS), "configs")  # every code package, and the configs


def _patch_meta(run: Path, **changes: object) -> None:
    m = orjson.loads((run / "meta.json").read_bytes())
    for k, v in changes.items():
        m[k] = v
    (run / "meta.json").write_bytes(orjson.dumps(m))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, object]:
    """A repository with the project's code and a registration committed together, and the
    registration's runs at 1.35 x lambda_ref (all arms and seeds), bound to it."""
    tmp = tmp_path_factory.mktemp("registered")
    work, _ = make_repo(tmp)
    for d in CODE:
        shutil.copytree(
            ROOT / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "inputs", "registrations")
        )
    inputs, tmpl = write_case(work)
    reg_path = work / "prereg" / "registrations" / "e2-test.yaml"
    fill_to_file(inputs, tmpl, reg_path)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "code and registration")
    commit = git(work, "rev-parse", "HEAD")
    reg = load_registration(reg_path)
    bundle = reg.bundle()
    runs = tmp / "runs"
    for arm in reg.arms:
        for seed in reg.seeds:
            rd = runs / run_name(arm, 1.35, seed)
            execute_run(bundle, arm, 1.35, seed, "sim", rd)
            _patch_meta(
                rd,
                registration=reg.binding("prereg/registrations/e2-test.yaml", commit),
                provenance={"git": {"commit": commit, "dirty": False}},
            )
    # four runs that must not count
    src = runs / run_name("burst", 1.35, 0)
    bad = tmp / "bad"
    for name, change in (
        ("other-registration", {"registration": {"name": "x", "sha256": "1" * 64}}),
        ("other-plan", {"plan": {"sha256": "2" * 64}}),
        ("other-pool", {"cell": {**reg.cell.model_dump(mode="json"), "kv_pool_tokens": 299999}}),
        ("other-code", {"provenance": {"git": {"commit": "3" * 40, "dirty": False}}}),
    ):
        shutil.copytree(src, bad / name)
        _patch_meta(bad / name, **change)
    return {"work": work, "reg": reg_path, "commit": commit, "runs": runs, "bad": bad, "tmp": tmp}


def test_only_bound_runs_count_and_the_registration_judges(project) -> None:
    p = project
    res = registered_analysis(p["reg"], [p["runs"], p["bad"]], p["tmp"] / "out1")
    r = res["registered"]
    assert r["judged_by"]["mode"] == "in-process" and r["judged_by"]["commit"] == p["commit"]
    assert len(r["runs_counted"]) == 9 and r["decisive"]
    reasons = {Path(x["run_dir"]).name: " ".join(x["reasons"]) for x in r["runs_excluded"]}
    assert "is not this registration's" in reasons["other-registration"]
    assert "plan SHA-256 " + "2" * 64 in reasons["other-plan"]
    assert "KV pool 299999" in reasons["other-pool"]
    assert "is not in this repository" in reasons["other-code"]
    reg = load_registration(p["reg"])
    assert res["rule_spec"] == reg.rule and res["references"]["lambda_ref"] == reg.references.lambda_ref
    by_rate = {x["rate"]: x for x in res["rates"]}
    assert by_rate[1.65]["verdict"] == "INCOMPLETE" and set(by_rate[1.65]["seeds"]["0"].values()) == {"MISSING"}
    kills = {k["id"]: k for k in r["kill_conditions"]}
    assert set(kills) == {"K1", "K2", "K3", "K4"} and kills["K4"]["triggered"] is False
    assert (p["tmp"] / "out1" / "registered-verdict.json").is_file()
    assert "judged by commit" in (p["tmp"] / "out1" / "registered-report.md").read_text()


def test_moved_checkout_is_judged_by_the_registrations_commit(project, tmp_path, monkeypatch) -> None:
    p = project
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the judge's worktree and files go
    work = p["work"]
    report = work / "analysis" / "paired.py"
    text = report.read_text()
    report.write_text(
        text.replace(
            '        "open_loop": verdict_block(open_loop),\n',
            '        "open_loop": verdict_block(open_loop),\n        "marker": "later code",\n',
        )
    )
    assert "later code" in report.read_text()
    git(work, "commit", "-q", "-am", "analysis changed after the registration")
    try:
        res = registered_analysis(p["reg"], [p["runs"]], p["tmp"] / "out2")
        j = res["registered"]["judged_by"]
        assert j["mode"] == "worktree" and j["commit"] == p["commit"] and "analysis/paired.py" in j["moved_paths"]
        assert "agentload-judge-" in j["module"] and str(work) not in j["module"]
        assert "marker" not in res  # the later code did not judge
        assert len(res["registered"]["runs_counted"]) == 9
        assert j["registered_grid"] and [x["rate"] for x in res["rates"]] == [
            1.35,
            1.65,
        ]  # the registered rates, 1.65 missing
        by_rate = {x["rate"]: x for x in res["rates"]}
        assert by_rate[1.65]["verdict"] == "INCOMPLETE"
        assert res["arms"] == ["burst", "noburst", "capped"] and "MISSING" not in by_rate[1.35]["seeds"]["0"].values()
        assert not list((work / ".git" / "worktrees").glob("*")) if (work / ".git" / "worktrees").exists() else True
        assert not list(scratch.iterdir())  # nothing left behind: the worktree, nor the frozen rule and test files
    finally:
        git(work, "reset", "-q", "--hard", p["commit"])
    here = registered_analysis(p["reg"], [p["runs"]], p["tmp"] / "out2b")
    assert here["registered"]["judged_by"]["mode"] == "in-process"
    assert here["rates"][0]["seeds"] == by_rate[1.35]["seeds"]  # the registration's code, in either mode, judges alike


def test_overrides_are_refused(project, capsys) -> None:
    from cli.main import main

    p = project
    assert main(["analyze", "--registration", str(p["reg"]), str(p["runs"]), "--lambda-ref", "0.1"]) == 2
    assert "--lambda-ref cannot be combined with a registration" in capsys.readouterr().err


def test_incomplete_registration_judges_nothing(tmp_path: Path) -> None:
    with pytest.raises(RegisteredAnalysisError, match="INCOMPLETE"):
        registered_analysis(ROOT / "prereg" / "registrations" / "e2-sglang-h200-300k.yaml", [tmp_path])


def test_cli_prints_the_registered_report(project, capsys) -> None:
    from cli.main import main

    p = project
    rc = main(["analyze", "--registration", str(p["reg"]), str(p["runs"]), "--out", str(p["tmp"] / "out3")])
    assert rc in (0, 1)
    out = capsys.readouterr().out
    assert "Registered analysis: e2-test (FILLED)" in out and "Kill conditions" in out
    assert json.loads((p["tmp"] / "out3" / "registered-verdict.json").read_text())["registered"]["rule"] == "e2"


def test_registrations_inputs_and_freeze_records_are_data_not_code() -> None:
    """Registering a test or freezing its predictions after the registration's commit changes no
    run or verdict, so runs made after such a commit stay bound; a change under harness/ does not."""
    from provenance.codepaths import is_code_path

    for p in (
        "prereg/registrations/x.yaml",
        "prereg/inputs/c/e0a.yaml",
        "prereg/templates/t.yaml",
        "prereg/freezes/pred-x.json",
        "predictions/x.yaml",
        "docs/x.md",
        "configs/cells/c.yaml",
    ):
        assert not is_code_path(p), p
    for p in ("harness/servers/base.py", "analysis/rules.py", "prereg/fill.py", "slurm/job.py"):
        assert is_code_path(p), p


# The last commit whose code judged E2 in the paired form (the rule as data under `arms` and `pass`),
# and that rule as the registrations of that time froze it.
PAIRED_FORM_COMMIT = "f8ce723a32e4224393baa2cc99623635525b64f8"
PAIRED_E2 = {
    "name": "e2",
    "version": 1,
    "description": "E2 paired test: BURST trapped, NOBURST good, CAPPED recovered in the same seed",
    "params": {
        "rate_tolerance": 0.15,
        "slope_factor": 0.5,
        "recovered_hit": 0.8,
        "recovered_outstanding": 20,
        "recovered_span": 300.0,
        "outstanding_stat": "mean",
        "backlog_bin": 10.0,
        "min_window": 600.0,
        "hit_threshold": 0.5,
        "stuck_followup": 0.2,
    },
    "states": [
        {
            "name": "TRAPPED",
            "all": [
                "lam > lam_miss",
                "abs(token_rate / all_miss_rate - 1) <= rate_tolerance",
                "slope > slope_factor * (lam - lam_miss)",
            ],
        },
        {"name": "RECOVERED", "all": ["hit_last > recovered_hit", "outstanding_last < recovered_outstanding"]},
        {"name": "DRAINING", "all": ["slope < 0"]},
        {"name": "INDETERMINATE", "all": []},
    ],
    "flags": {"stuck": "followup_hit < stuck_followup"},
    "arms": {"BURST": ["TRAPPED"], "NOBURST": ["RECOVERED"], "CAPPED": ["RECOVERED"]},
    "pass": {"min_seeds": 3, "min_good_seeds": 2},
}


def test_a_registration_in_the_paired_form_is_judged_by_its_own_commit(project, tmp_path: Path) -> None:
    """A registration made before E2 became a staged spec loads here (its rule is read, not judged),
    and its verdict comes from the code of its commit, in a worktree, even with nothing moved since;
    the kill conditions are evaluated here on that verdict."""
    import yaml

    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{PAIRED_FORM_COMMIT}^{{commit}}"]).returncode:
        pytest.skip(f"the repository's history lacks commit {PAIRED_FORM_COMMIT[:12]} (a shallow clone)")
    work, _ = make_repo(tmp_path)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PAIRED_FORM_COMMIT], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    data = yaml.safe_load(Path(project["reg"]).read_text())
    data["rule"] = PAIRED_E2
    reg_path = work / "prereg" / "registrations" / "e2-old.yaml"
    reg_path.write_text(yaml.safe_dump(data, sort_keys=False))
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "the code of that time and a registration")
    commit = git(work, "rev-parse", "HEAD")
    reg = load_registration(reg_path)  # loading at HEAD does not fail on the old form
    assert reg.rule["arms"]["BURST"] == ["TRAPPED"] and reg.status == "FILLED"
    runs = tmp_path / "runs"
    for d in sorted(Path(project["runs"]).iterdir()):
        shutil.copytree(d, runs / d.name)
        _patch_meta(
            runs / d.name,
            registration=reg.binding("prereg/registrations/e2-old.yaml", commit),
            provenance={"git": {"commit": commit, "dirty": False}},
        )
    res = registered_analysis(reg_path, [runs], tmp_path / "out")
    j = res["registered"]["judged_by"]
    assert j["mode"] == "worktree" and j["commit"] == commit and j["registered_grid"]
    assert res["rule_spec"]["arms"] == PAIRED_E2["arms"] and not res["registered"]["family"]
    assert len(res["registered"]["runs_counted"]) == 9
    by_rate = {x["rate"]: x for x in res["rates"]}
    assert by_rate[1.65]["verdict"] == "INCOMPLETE" and "MISSING" not in by_rate[1.35]["seeds"]["0"].values()
    here = registered_analysis(project["reg"], [project["runs"]], tmp_path / "here")  # the staged e2 spec
    assert by_rate[1.35]["seeds"] == {x["rate"]: x for x in here["rates"]}[1.35]["seeds"]
    assert by_rate[1.35]["verdict"] == here["rates"][0]["verdict"]
    kills = {k["id"]: k["triggered"] for k in res["registered"]["kill_conditions"]}
    assert kills == {k["id"]: k["triggered"] for k in here["registered"]["kill_conditions"]}
    assert "Kill conditions" in (tmp_path / "out" / "registered-report.md").read_text()
    assert (tmp_path / "out" / "report.md").read_text().startswith("### ")
