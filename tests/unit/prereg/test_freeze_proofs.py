"""Freezing predictions (commit, tag with hashes, push, read-back) and proofs that a file is
unchanged since its commit, on a real git repository with a bare remote, in both object formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.gitfixture import commit_file, git, make_repo

from prereg.freeze import FreezeError, freeze, read_frozen
from prereg.predictions import About, Prediction, make_file, write_predictions
from provenance.git import Repo
from provenance.meta import sha256_file
from provenance.proofcheck import tag_message_hashes
from provenance.proofs import prove, verify_proof


def _predictions(path: Path, value: float = 0.5) -> Path:
    p = Prediction(
        "p1",
        "stuck",
        About("run", "burst", 1.35, 0),
        "probability",
        {"kind": "declared"},
        {"event": {"equals": True}, "probability": value},
    )
    pf = make_file("unit", [p], test="t", registration=None, predictor={"kind": "declared"}, could_see=["nothing"])
    return write_predictions(pf, path)


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
def test_freeze_commits_tags_pushes_and_reads_back(tmp_path: Path, fmt: str) -> None:
    work, remote = make_repo(tmp_path, object_format=fmt)
    f = _predictions(work / "predictions" / "p.yaml")
    rec = freeze([f], tag="pred-unit")
    repo = Repo(work)
    assert rec.data["object_format"] == fmt and rec.data["new_commit"]
    assert tag_message_hashes(repo.tag_message("pred-unit")) == {"predictions/p.yaml": sha256_file(f)}
    # the remote holds the commit on its branch and the very tag object
    assert git(remote, "rev-parse", "refs/heads/main") == rec.commit
    assert git(remote, "rev-parse", "refs/tags/pred-unit") == rec.data["tag_object"]
    assert rec.confirmed_at and rec.confirmed_at >= rec.data["committed_at"]
    record_text = (work / "prereg" / "freezes" / "pred-unit.json").read_text()
    assert json.loads(record_text)["tag"] == "pred-unit"
    # the record is committed: the local bare remote is named, no path of this host is in it
    assert rec.data["remote"]["url"] == remote.name and str(tmp_path) not in record_text
    # a tag is never moved or re-made
    with pytest.raises(FreezeError, match="never moves a tag"):
        freeze([f], tag="pred-unit")


def test_freeze_refuses_a_dirty_tree(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    commit_file(work, "code.py", "x = 1\n")
    (work / "code.py").write_text("x = 2\n")
    f = _predictions(work / "p.yaml")
    with pytest.raises(FreezeError, match="uncommitted changes besides the files to freeze"):
        freeze([f], tag="t1")
    assert Repo(work).local_tag("t1") is None


def test_a_remade_tracked_prediction_file_is_frozen_again(tmp_path: Path) -> None:
    """A prediction file already committed, then re-made (tracked and modified), is the file being
    frozen, not another change: the second freeze commits and tags it."""
    work, _ = make_repo(tmp_path)
    f = _predictions(work / "predictions" / "p.yaml", 0.5)
    freeze([f], tag="pred-first")
    _predictions(f, 0.7)
    rec = freeze([f], tag="pred-second")
    assert (
        tag_message_hashes(Repo(work).tag_message("pred-second")) == {"predictions/p.yaml": sha256_file(f)}
        and rec.data["new_commit"]
    )


def test_errata_and_edits_never_move_the_tag(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    f = _predictions(work / "p.yaml", 0.5)
    rec = freeze([f], tag="pred-e")
    frozen_bytes = f.read_bytes()
    _predictions(f, 0.9)  # edited in the work tree
    fz = read_frozen("pred-e", Repo(work))
    ff = fz.files[0]
    assert ff.data == frozen_bytes and ff.edited_since and not ff.errata and not fz.problems
    assert ff.predictions is not None and ff.predictions.predictions[0].payload["probability"] == 0.5
    git(work, "commit", "-q", "-am", "erratum: p1")  # an erratum is a new commit
    fz = read_frozen("pred-e", Repo(work))
    assert fz.commit == rec.commit and len(fz.files[0].errata) == 1
    assert fz.files[0].data == frozen_bytes  # scored from the tag, not from the erratum


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
def test_proof_verifies_without_git_and_any_altered_byte_breaks_it(tmp_path: Path, fmt: str) -> None:
    work, _ = make_repo(tmp_path, object_format=fmt)
    f = _predictions(work / "deep" / "er" / "p.yaml")
    freeze([f], tag="pred-proof")
    proof = prove(f, tmp_path / "proof", tag="pred-proof")
    res = verify_proof(proof, file_copy=f)
    assert res.ok, res.text()
    names = [c[0] for c in res.checks]
    assert any("tree deep/er holds" in n for n in names) and "tag message states the file's SHA-256" in names
    # the copied standalone script verifies it too, with no project code on the path
    out = subprocess.run(
        [sys.executable, "-I", str(proof / "verify_proof.py"), "--file", str(f)], capture_output=True, text=True
    )
    assert out.returncode == 0 and "VERIFIED" in out.stdout
    man = json.loads((proof / "proof.json").read_text())
    for oid, kind in man["objects"].items():  # one altered byte in any stored object breaks the chain
        p = proof / "objects" / oid
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(data))
        bad = verify_proof(proof)
        assert not bad.ok and any(oid[:12] in x for x in bad.failures), (kind, bad.text())
        data[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(data))
    assert verify_proof(proof).ok
    # an edit to the file after its commit: the copy no longer matches the proven bytes
    _predictions(f, 0.7)
    res = verify_proof(proof, file_copy=f)
    assert not res.ok and any("byte-identical" in x for x in res.failures)


def test_proof_of_an_untagged_commit_checks_runs(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    commit_file(work, "prereg/registrations/r.yaml", "name: r\nstatus: FILLED\n")
    reg = work / "prereg/registrations/r.yaml"
    proof = prove(reg, tmp_path / "proof")
    good = tmp_path / "run-a"
    bad = tmp_path / "run-b"
    for d, sha in ((good, sha256_file(reg)), (bad, "0" * 64)):
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"registration": {"sha256": sha}}))
    assert verify_proof(proof, run_dirs=[good]).ok
    res = verify_proof(proof, run_dirs=[good, bad])
    assert not res.ok and any("run-b" in x for x in res.failures)
