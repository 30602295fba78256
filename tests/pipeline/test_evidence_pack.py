"""`evidence pack` then `evidence check`, on a registered test made here: a fixture repository with a
copy of the project's code and a bare remote (tests/support/slurm_fixture.py), a mini E2 registered
by formula (one seed, the rule judged on one seed), committed and pushed, the simulator's
prediction frozen, submitted with the local executor in the simulator, collected (its registered
verdict), packed, and checked in a folder with no repository.

Why here and not only on the committed bundle: the committed bundle was packed once, on the local
SLURM cluster (scripts/evidence-demo.sh); this packs a fresh one in CI, so a change to what a test
directory holds, to a proof, or to the judge shows up as a pack or a check that fails. The local
executor has no scheduler, hence no accounting export: its own job record travels instead, and the
timeline reads the runs' meta.json times. About half a minute: three simulated runs, and one fresh
seed per arm for the prediction.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.slurm_fixture import commit, fill, make_project, one_seed_rule

from cli.main import main
from provenance.git import Repo
from review.evidence import EvidenceError, pack
from review.evidence_check import check_bundle


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("evidence")
    work, _ = make_project(tmp)
    reg = fill(work, "e2-mini", seeds="[3]", fractions="[[1, 2]]", rule=one_seed_rule(work))
    commit(work, "register e2-mini", push=True)
    pred = work / "predictions" / "e2-mini-sim.yaml"
    testdir = tmp / "results" / "e2-mini"
    assert main(["predict", "make", "sim", str(reg), "--seeds", "1", "--out", str(pred)]) == 0
    assert main(["predict", "freeze", str(pred), "--tag", "pred-e2-mini", "--testdir", str(testdir)]) == 0
    time.sleep(1.1)  # times are recorded to the second: the runs start strictly after the freeze
    rc = main(["submit", str(reg), "--executor", "local", "--engine", "sim", "--parallel", "2", "--out", str(testdir)])
    assert rc == 0
    assert main(["jobs", "collect", str(testdir / "submission.json")]) in (0, 1)
    return {"tmp": tmp, "work": work, "testdir": testdir}


def test_a_packed_test_checks_from_the_bundle_alone(
    submitted: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "packed" / "e2-mini"
    res = pack(submitted["testdir"], out, repo=Repo(submitted["work"]), note="A test fixture's bundle.")
    assert res.total_bytes == sum(f["size"] for f in res.files) and not res.warnings
    doc = orjson.loads((out / "bundle.json").read_bytes())
    assert doc["registration"]["path"] == "prereg/registrations/e2-mini.yaml"
    assert doc["freezes"][0]["tag"] == "pred-e2-mini" and (out / "repo" / "predictions" / "e2-mini-sim.yaml").is_file()
    assert (out / "test" / "provenance" / "local-jobs.json").is_file()
    assert sorted(p.name for p in (out / "test" / "runs").iterdir()) == [
        "burst-r1.50-s3",
        "capped-r1.50-s3",
        "noburst-r1.50-s3",
    ]
    assert not list((out / "test" / "runs").glob("*/*.jsonl"))  # the compacted tables travel, not the JSONL

    reviewer = tmp_path / "reviewer"  # no repository here, nor above it
    shutil.copytree(out, reviewer / "e2-mini")
    monkeypatch.chdir(reviewer)
    chk = check_bundle(reviewer / "e2-mini")
    assert chk.ok, chk.text()
    names = [n for _, n, _, _ in chk.checks]
    assert any(n.startswith("recomputed verdict") for n in names)
    assert any("code is the registration's" in n for n in names)
    assert any(n.startswith("freeze pred-e2-mini confirmed on the remote before the first run start") for n in names)
    assert any(f.startswith("label: pre-registered") for f in chk.facts), chk.facts


def test_pack_refuses_a_freeze_tag_the_repository_lacks(submitted: dict[str, Any], tmp_path: Path) -> None:
    from support.gitfixture import git

    work = submitted["work"]
    obj = git(work, "rev-parse", "refs/tags/pred-e2-mini")
    git(work, "tag", "-d", "pred-e2-mini")  # as a clone that fetched no tags
    try:
        with pytest.raises(EvidenceError, match=r"the freeze tag pred-e2-mini in .*git fetch origin tag pred-e2-mini"):
            pack(submitted["testdir"], tmp_path / "b", repo=Repo(work))
    finally:
        git(work, "update-ref", "refs/tags/pred-e2-mini", obj)
