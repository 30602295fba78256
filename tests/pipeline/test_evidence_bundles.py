"""Every committed evidence bundle (evidence/*/bundle.json, docs/evidence.md) checks from the bundle
alone, and a tampered bundle fails with the reason.

Each bundle is copied out of the repository into an empty folder, the current folder is that
folder, and `git` on the PATH is a stub that records any call and fails: what a reviewer with a
fresh clone and no tags has (less, in fact: no repository at all). No engine, no cluster; a few
seconds a bundle (the verdict is recomputed, its figure drawn).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from provenance.meta import sha256_file
from review.evidence import EvidenceError, pack
from review.evidence_check import EvidenceCheck, check_bundle

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = sorted(p.parent for p in (ROOT / "evidence").glob("*/bundle.json"))


@pytest.fixture
def no_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty folder as the current one, and a `git` that fails and leaves a mark when called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "git-was-called"
    stub = bin_dir / "git"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {mark}\nexit 97\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    work = tmp_path / "reviewer"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    assert not mark.exists(), f"the check ran git: {mark.read_text()}"


def _copy(bundle: Path, where: Path) -> Path:
    dst = where / bundle.name
    shutil.copytree(bundle, dst)
    return dst


def _rehash(bundle: Path) -> None:
    """Re-list every file in bundle.json, as a forger who edits a file would."""
    doc = orjson.loads((bundle / "bundle.json").read_bytes())
    doc["files"] = [
        {"path": p.relative_to(bundle).as_posix(), "sha256": sha256_file(p), "size": p.stat().st_size}
        for p in sorted(bundle.rglob("*"))
        if p.is_file() and p.name != "bundle.json"
    ]
    (bundle / "bundle.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _breaks(res: EvidenceCheck, area: str) -> list[str]:
    return [f"{n}: {d}" for a, n, ok, d in res.checks if a == area and not ok]


def test_there_is_a_committed_bundle() -> None:
    assert BUNDLES, "no evidence bundle is committed under evidence/ (scripts/evidence-demo.sh makes one)"


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_committed_bundle_checks_with_no_git(bundle: Path, no_git: Path) -> None:
    res = check_bundle(_copy(bundle, no_git))
    assert res.ok, res.text()
    areas = {a for a, *_ in res.checks}
    assert areas == {"files", "verdict", "proofs", "timeline"}, areas
    names = [n for _, n, _, _ in res.checks]
    assert any(n.startswith("recomputed verdict") for n in names)
    assert any("hashes to the bound SHA-256" in n for n in names)  # the registration, from its proof's objects
    assert any("code is the registration's" in n for n in names)  # ancestry and tree diff from the proofs
    assert any("registration committed before the first run start" in n for n in names)
    assert any(n.startswith("label claimed at submission") for n in names)


@pytest.fixture
def demo(no_git: Path) -> Path:
    if not BUNDLES:
        pytest.skip("no committed bundle to tamper with")
    return _copy(BUNDLES[0], no_git)


def test_a_changed_record_byte_breaks_its_hash(demo: Path) -> None:
    turns = sorted((demo / "test" / "runs").glob("*/turns.parquet"))[0]
    data = bytearray(turns.read_bytes())
    data[len(data) // 2] ^= 0xFF
    turns.write_bytes(bytes(data))
    res = check_bundle(demo)
    rel = turns.relative_to(demo).as_posix()
    assert not res.ok
    assert any(b.startswith(f"{rel}: ") and "hashing to" in b for b in _breaks(res, "files")), res.text()


def test_a_changed_verdict_is_not_the_recomputed_one(demo: Path) -> None:
    vpath = demo / "test" / "analysis" / "registered-verdict.json"
    v = orjson.loads(vpath.read_bytes())
    was = v["verdict"]
    v["verdict"] = "FAIL" if was != "FAIL" else "PASS"
    vpath.write_bytes(orjson.dumps(v, option=orjson.OPT_INDENT_2))
    _rehash(demo)  # the files' hashes then hold: only the recomputation can catch it
    res = check_bundle(demo)
    assert not _breaks(res, "files")
    (b,) = _breaks(res, "verdict")
    assert f"verdict: bundled {v['verdict']!r}, recomputed {was!r}" in b, res.text()


def test_a_recomputed_statistic_may_move_in_its_last_digits_but_no_further() -> None:
    """The bundled verdict and the recomputed one are compared field by field: a float may differ
    by rounding (another numpy sums in another order: a slope moved by 2 units in the last place
    between two machines of one kind), a count, a state or a float beyond rounding may not."""
    from review.evidence_check import _diff

    slope = 0.9466777797601096
    assert _diff({"stats": {"slope": slope}}, {"stats": {"slope": 0.9466777797601094}}) == []
    assert _diff({"x": float("nan")}, {"x": float("nan")}) == []
    assert _diff({"stats": {"slope": slope}}, {"stats": {"slope": slope * (1 + 1e-9)}})
    assert _diff({"n": 3}, {"n": 4}) and _diff({"state": "TRAPPED"}, {"state": "INDETERMINATE"})
    assert _diff({"n": 3}, {"n": 3.0000000000000004})  # a count is not rounded: compared exactly


def test_a_missing_registration_proof_breaks_the_registration(demo: Path) -> None:
    doc = orjson.loads((demo / "bundle.json").read_bytes())
    commit = doc["registration"]["commit"]
    shutil.rmtree(demo / "test" / "provenance" / "proofs" / f"registration-{commit[:12]}")
    _rehash(demo)
    res = check_bundle(demo)
    breaks = _breaks(res, "proofs")
    assert any(b.startswith(f"a proof of {doc['registration']['path']} at its commit") for b in breaks), res.text()
    assert any("hashes to the bound SHA-256" in b and "is not in commit" in b for b in breaks), res.text()
    assert any("registration committed before the first run start" in b for b in _breaks(res, "timeline"))


def test_a_changed_prediction_copy_is_not_the_proven_one(demo: Path) -> None:
    doc = orjson.loads((demo / "bundle.json").read_bytes())
    (path,) = doc["freezes"][0]["files"]
    copy = demo / "repo" / path
    copy.write_bytes(copy.read_bytes() + b"# edited after the freeze\n")
    _rehash(demo)
    res = check_bundle(demo)
    assert any(
        b.startswith(f"{path}: proven at the freeze record's tag") and "byte-identical" in b
        for b in _breaks(res, "proofs")
    ), res.text()


def test_a_freeze_confirmed_after_the_runs_breaks_the_timeline(demo: Path) -> None:
    doc = orjson.loads((demo / "bundle.json").read_bytes())
    tag = doc["freezes"][0]["tag"]
    rec_path = demo / "test" / "provenance" / "freezes" / f"{tag}.json"
    rec = orjson.loads(rec_path.read_bytes())
    rec["confirmed_at"] = "2999-01-01T00:00:00+00:00"
    rec_path.write_bytes(orjson.dumps(rec, option=orjson.OPT_INDENT_2))
    _rehash(demo)
    res = check_bundle(demo)
    breaks = _breaks(res, "timeline")
    assert any(b.startswith(f"freeze {tag} confirmed on the remote before the first run start") for b in breaks)
    assert any("claimed 'blind in time'" in b and "not blind" in b for b in breaks), res.text()


def test_pack_refuses_naming_every_missing_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test directory lacking what the verdict and provenance need, outside any repository: one
    refusal that names each piece, where it was looked for and which step writes it."""
    if not BUNDLES:
        pytest.skip("no committed bundle to take a test directory from")
    monkeypatch.chdir(tmp_path)
    td = tmp_path / "results" / "t"
    shutil.copytree(BUNDLES[0] / "test", td)
    (td / "collection.json").unlink()
    shutil.rmtree(td / "analysis")
    run = sorted((td / "runs").iterdir())[0]
    (run / "plan.parquet").unlink()
    with pytest.raises(EvidenceError) as err:
        pack(td, tmp_path / "bundle")
    msg = str(err.value)
    assert f"{td / 'collection.json'} (written by `agentload jobs collect`)" in msg
    assert "a registered verdict (registered-verdict.json)" in msg and "agentload analyze --registration" in msg
    assert f"{run}: the frozen plan plan.parquet the run played is not there" in msg
    assert "a git repository holding" in msg and "--repo" in msg
    assert not (tmp_path / "bundle").exists()


def test_a_label_claimed_that_the_record_does_not_give_breaks(demo: Path) -> None:
    sub = demo / "test" / "submission.json"
    doc = orjson.loads(sub.read_bytes())
    doc["label_at_submission"]["label"] = (
        "pre-registered" if doc["label_at_submission"]["label"] != "pre-registered" else "registered"
    )
    sub.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    _rehash(demo)
    res = check_bundle(demo)
    assert any(b.startswith("label claimed at submission") for b in _breaks(res, "timeline")), res.text()


RESUBMITTED = [b for b in BUNDLES if any((b / "test" / "superseded").glob("*/meta.json"))]


@pytest.mark.parametrize("bundle", RESUBMITTED, ids=[b.name for b in RESUBMITTED])
def test_a_resubmitted_job_whose_kept_run_had_started_breaks(bundle: Path, no_git: Path) -> None:
    """A bundle whose test resubmitted a job (`jobs resubmit`) carries that job's run under
    superseded/, and the check reads it: were it a run that had sent turns, repeating it would have
    been choosing an outcome, and the bundle breaks naming the job (even with every hash re-listed)."""
    copy = _copy(bundle, no_git)
    ok = check_bundle(copy)
    assert ok.ok and any(n.startswith("runs: job ") and "never started its run" in n for _, n, _, _ in ok.checks)
    meta_path = sorted((copy / "test" / "superseded").glob("*/meta.json"))[0]
    meta = orjson.loads(meta_path.read_bytes())
    meta["tables"]["turns"]["rows"] = 40
    meta["drive"]["sent"] = 40
    meta_path.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    _rehash(copy)
    res = check_bundle(copy)
    assert any("never started its run" in b and "its run had started" in b for b in _breaks(res, "proofs")), res.text()
