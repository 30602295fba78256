"""`analyze --registration` on a family registration (a staged rule): a FILLED BASIN-1
registration based on a short E2 calibration, its runs in the simulator, and the registered verdict
against the plain `analyze` of the same runs unbound (the frozen rule spec and references given as
files and options)."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
import yaml
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

# BASIN-1 on the short protocol: one seed, so the rule's seed quota is one (a rule override the
# registration freezes with the spec)
FAMILY_TEMPLATE = """format: agentload-registration-template
format_version: 1
name: basin-test
test: basin-test
description: BASIN-1 on the short calibration, one seed
based_on: prereg/registrations/e2-test.yaml
rule: basin-1
rule_overrides: {min_seeds: 1}
arms: [basin-n100, basin-n25]
rates: [1.65]
seeds: [0]
"""


def _patch_meta(run: Path, **changes: object) -> None:
    m = orjson.loads((run / "meta.json").read_bytes())
    m.update(changes)
    (run / "meta.json").write_bytes(orjson.dumps(m))


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("registered-family")
    work, _ = make_repo(tmp)
    for d in CODE:
        shutil.copytree(
            ROOT / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "inputs", "registrations")
        )
    inputs, tmpl = write_case(work)
    (work / "prereg" / "registrations").mkdir(parents=True, exist_ok=True)
    fill_to_file(inputs, tmpl, work / "prereg" / "registrations" / "e2-test.yaml", repo_root=work)
    ftmpl = work / "prereg" / "templates" / "basin-test.yaml"
    ftmpl.write_text(FAMILY_TEMPLATE)
    reg_path = work / "prereg" / "registrations" / "basin-test.yaml"
    fill_to_file(None, ftmpl, reg_path, repo_root=work)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "code and registrations")
    commit = git(work, "rev-parse", "HEAD")
    reg = load_registration(reg_path)
    runs = tmp / "runs"
    for arm in reg.arms:
        rd = runs / run_name(arm, 1.65, 0)
        execute_run(reg.bundle(), arm, 1.65, 0, "sim", rd)
        _patch_meta(
            rd,
            registration=reg.binding("prereg/registrations/basin-test.yaml", commit),
            provenance={"git": {"commit": commit, "dirty": False}},
        )
    return {"work": work, "reg": reg_path, "commit": commit, "runs": runs, "tmp": tmp}


def _strip(obj: object) -> object:
    """A verdict part without run directories (the same runs judged from two folders)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k != "run_dir"}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _runs_without_dirs(verdict: dict) -> list[dict]:
    return sorted((_strip(r) for r in verdict["runs"]), key=lambda r: (r["arm"], r["seed"]))


def test_family_registration_gets_the_plain_analyze_verdict(family) -> None:
    from cli.main import main

    f = family
    reg = load_registration(f["reg"])
    assert reg.status == "FILLED" and reg.rule["name"] == "basin-1" and reg.rule["params"]["min_seeds"] == 1
    res = registered_analysis(f["reg"], [f["runs"]], f["tmp"] / "out-reg")
    r = res["registered"]
    assert r["family"] and r["decisive"] and r["judged_by"]["mode"] == "in-process" and len(r["runs_counted"]) == 2
    assert (
        res["rule_spec"] == reg.rule
        and res["arms"] == ["basin-n100", "basin-n25"]
        and res["registered_rates"] == [1.65]
    )
    assert all(c["holds"] for x in res["runs"] for c in x["count_if"])  # run.bound among them
    assert res["verdict"] in ("PASS", "FAIL")
    assert (f["tmp"] / "out-reg" / "figure.png").is_file() and "BASIN" in (
        f["tmp"] / "out-reg" / "registered-report.md"
    ).read_text().upper()

    # the plain path: the same runs, unbound, judged by `analyze` with the frozen spec and references
    plain = f["tmp"] / "plain"
    for rd in sorted(f["runs"].iterdir()):
        shutil.copytree(rd, plain / rd.name)
        _patch_meta(plain / rd.name, registration=None)
    rule_file = f["tmp"] / "rule.yaml"
    rule_file.write_text(yaml.safe_dump(reg.rule, sort_keys=False))
    rc = main(
        [
            "analyze",
            str(plain),
            "--rule",
            str(rule_file),
            "--lambda-ref",
            repr(reg.references.lambda_ref),
            "--all-miss-rate",
            repr(reg.references.all_miss_token_rate),
            "--out",
            str(f["tmp"] / "out-plain"),
        ]
    )
    assert rc == 0
    ref = orjson.loads((f["tmp"] / "out-plain" / "verdict.json").read_bytes())
    assert ref["verdict"] == res["verdict"] and _strip(ref["groups"]) == _strip(res["groups"])
    assert _runs_without_dirs(ref) == _runs_without_dirs(res)

    # a run of another registration does not count (the staged rule's own run.bound agrees)
    other = f["tmp"] / "other"
    shutil.copytree(f["runs"], other)
    for rd in other.iterdir():
        _patch_meta(rd, registration={"name": "x", "sha256": "1" * 64})
    res2 = registered_analysis(f["reg"], [other], f["tmp"] / "out-other")
    assert not res2["registered"]["runs_counted"] and res2["verdict"] == "INCOMPLETE"

    # judged by the registration's commit in a worktree: the same verdict
    wt = registered_analysis(f["reg"], [f["runs"]], f["tmp"] / "out-wt", force_worktree=True)
    assert wt["registered"]["judged_by"]["mode"] == "worktree" and wt["registered"]["judged_by"]["registered_grid"]
    assert (
        wt["verdict"] == res["verdict"]
        and _strip(wt["groups"]) == _strip(res["groups"])
        and _runs_without_dirs(wt) == _runs_without_dirs(res)
    )


def test_family_rule_with_predictions_needs_the_frozen_file(family, tmp_path: Path) -> None:
    """CUT and MIRROR compare with frozen predictions: none beside the runs is a clear error."""
    f = family
    data = yaml.safe_load(Path(f["reg"]).read_text())
    data["rule"]["predictions"] = {"arms": ["basin-n100"]}
    p = tmp_path / "with-predictions.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RegisteredAnalysisError, match=r"compares with frozen predictions.*--predictions FILE"):
        registered_analysis(p, [f["runs"]], tmp_path / "out")
