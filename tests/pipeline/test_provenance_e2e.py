"""End to end on a fixture repository with a bare remote: make predictions with the simulator and
model F for a small registered test, freeze them, run the test, score it; freeze a copy after the
runs; edit a frozen file; then every break `provenance verify` must catch.

One world is built per module (about ten short simulated runs); each break test works on a copy
of the test directory so the others see the intact record.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.gitfixture import git, make_repo
from support.provfixture import commit_registration, record_submission, run_all, write_test

from cli.main import main
from harness.config import load_test
from prereg.predict_sim import simulator_predictions
from prereg.predict_theory import model_f_predictions
from prereg.predictions import write_predictions
from provenance.git import Repo
from provenance.proofcheck import verify_proof
from provenance.proofs import prove
from review.timeline import build_timeline
from review.verify import verify_test
from runs.arms import execute_run
from runs.backend import BackendResult, RunContext, register_backend


def _interrupted_backend(ctx: RunContext) -> BackendResult:
    """A job killed by the scheduler before its run got anywhere."""
    return BackendResult("INTERRUPTED", "SIGTERM from the scheduler", 0.0, {"engine": {"backend": "interrupted"}})


register_backend("interrupted", _interrupted_backend)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("world")
    work, remote = make_repo(root)
    test_path = write_test(work)
    bundle = load_test(test_path)
    binding = commit_registration(work, bundle)
    reg_file = work / binding["path"]
    testdir = root / "results" / "tiny-e2"
    sim = write_predictions(
        simulator_predictions(test_path, n_seeds=2, registration=reg_file), work / "predictions" / "tiny-sim.yaml"
    )
    mf = write_predictions(
        model_f_predictions(test_path, registration=reg_file, intervals=[(600.0, 1800.0)], wave=True, trap_state=True),
        work / "predictions" / "tiny-mf.yaml",
    )
    values = work / "predictions" / "tiny-values.json"  # a rule's model-value file, frozen beside them
    values.write_text(
        json.dumps(
            {
                "format": "agentload-predictions",
                "format_version": 1,
                "name": "tiny-values",
                "runs": [{"arm": "burst", "rate": 1.35, "seed": s, "values": {"slope": 0.01}} for s in (0, 1)],
            }
        )
    )
    assert (
        main(["predict", "freeze", str(sim), str(mf), str(values), "--tag", "pred-tiny", "--testdir", str(testdir)])
        == 0
    )
    time.sleep(1.1)  # run times are recorded to the second: start strictly after the confirmation
    record_submission(testdir, work, binding, label="pre-registered")
    runs = run_all(test_path, testdir, binding)
    late = work / "predictions" / "tiny-sim-late.yaml"
    shutil.copyfile(sim, late)
    assert main(["predict", "freeze", str(late), "--tag", "pred-tiny-late", "--testdir", str(testdir)]) == 0
    return {
        "root": root,
        "work": work,
        "remote": remote,
        "test": test_path,
        "bundle": bundle,
        "binding": binding,
        "testdir": testdir,
        "sim": sim,
        "mf": mf,
        "late": late,
        "runs": runs,
    }


def _score(world: dict[str, Any], tag: str, monkeypatch: pytest.MonkeyPatch, out: Path) -> dict[str, Any]:
    monkeypatch.chdir(world["work"])
    rc = main(["predict", "score", tag, str(world["testdir"]), "--out", str(out)])
    assert rc == 0
    return json.loads((out / f"{tag}.score.json").read_text())


def test_frozen_before_the_runs_scores_blind_in_time_with_hits_and_misses(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rep = _score(world, "pred-tiny", monkeypatch, tmp_path)
    assert rep["freezes"][0]["blindness"] == "blind in time"
    scored = [s for f in rep["scores"] for s in f["scored"]]
    results = {s["result"] for s in scored}
    assert {"hit", "miss"} <= results
    assert all(s["blindness"] == "blind in time" for s in scored)
    by_id = {s["id"]: s for s in scored}
    # NOBURST stays good and is predicted to: a hit scored against the run's own verdict
    assert (
        by_id["sim-noburst-r1.35-s0-stuck"]["result"] == "hit"
        and by_id["sim-noburst-r1.35-s0-stuck"]["outcome"] is False
    )
    # every BURST run is stuck in this tiny test, and model F's onset criterion calls it
    assert all(by_id[f"mf-burst-r1.35-s{s}-stuck"]["result"] == "hit" for s in (0, 1))
    # interval quantities, the wave and the trap-state targets are measured on the runs' records
    for q in ("slope-600_1800", "completions-600_1800", "wave", "S1", "S3", "S4"):
        assert by_id[f"mf-burst-r1.35-s0-{q}"]["result"] in ("hit", "miss"), by_id[f"mf-burst-r1.35-s0-{q}"]
    # the rate's PASS probability is recomputed from its per-seed probabilities
    rule = by_id["sim-r1.35-pass"]
    assert rule["probability"] == pytest.approx(rule["stated_probability"], abs=1e-6)
    md = (tmp_path / "pred-tiny.score.md").read_text()
    assert "### Misses" in md and "### Hits" in md and "blind in time" in md and "**MISS**" in md and "**HIT**" in md


def test_freezing_after_the_runs_is_not_blind(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rep = _score(world, "pred-tiny-late", monkeypatch, tmp_path)
    assert rep["freezes"][0]["blindness"] == "not blind"
    assert all(s["blindness"] == "not blind" for f in rep["scores"] for s in f["scored"])


def test_timeline_orders_the_record_and_gives_the_labels(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tl = build_timeline(world["testdir"], repo=Repo(world["work"]))
    assert tl.label == "pre-registered", tl.label_reason
    labels = {f.tag: f.overall.label for f in tl.freezes}
    assert labels == {"pred-tiny": "blind in time", "pred-tiny-late": "not blind"}
    early = next(f for f in tl.freezes if f.tag == "pred-tiny")
    mv = {k: b.label for k, b in early.by_prediction.items() if k.startswith("predictions/tiny-values.json:")}
    assert len(mv) == 2 and set(mv.values()) == {"blind in time"}
    assert {f["kind"] for f in early.frozen.record.data["files"]} == {"predictions", "model-values"}
    kinds = [e.kind for e in tl.events]
    assert kinds.index("registration committed") < kinds.index("registration on remote") < kinds.index("run start")
    assert main(["provenance", "timeline", str(world["testdir"]), "--repo", str(world["work"])]) == 0
    out = capsys.readouterr().out
    assert (
        "registration label: PRE-REGISTERED" in out
        and "pred-tiny: BLIND IN TIME" in out
        and "pred-tiny-late: NOT BLIND" in out
    )


def test_the_intact_test_verifies(world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    v = verify_test(world["testdir"], repo=Repo(world["work"]), code_check=False)
    assert v.ok, v.text()
    assert main(["provenance", "verify", str(world["testdir"]), "--no-code-check", "--repo", str(world["work"])]) == 0
    assert "HOLDS" in capsys.readouterr().out


def test_editing_a_frozen_file_is_caught_by_the_proof_and_by_score(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sim = world["sim"]
    original = sim.read_bytes()
    proof = prove(sim, tmp_path / "proof", tag="pred-tiny")
    assert verify_proof(proof, file_copy=sim).ok
    before = _score(world, "pred-tiny", monkeypatch, tmp_path / "before")
    try:
        sim.write_bytes(original.replace(b"probability: 1.0", b"probability: 0.0"))
        res = verify_proof(proof, file_copy=sim)
        assert not res.ok and any("byte-identical" in f for f in res.failures)
        after = _score(world, "pred-tiny", monkeypatch, tmp_path / "after")
        f = next(x for x in after["files"] if x["path"].endswith("tiny-sim.yaml"))
        assert f["edited_since_freeze"]
        strip = lambda r: [(s["id"], s["result"]) for sc in r["scores"] for s in sc["scored"]]  # noqa: E731
        assert strip(after) == strip(before)  # scored from the tag's bytes, not the edit
        assert "EDITED AFTER THE FREEZE" in (tmp_path / "after" / "pred-tiny.score.md").read_text()
        # committed, the edit is an erratum: listed with its time, the tag still scores the frozen bytes
        git(
            world["work"],
            "commit",
            "-q",
            "-m",
            "erratum to the simulator predictions",
            "--",
            str(sim.relative_to(world["work"])),
        )
        errata = _score(world, "pred-tiny", monkeypatch, tmp_path / "erratum")
        f = next(x for x in errata["files"] if x["path"].endswith("tiny-sim.yaml"))
        assert len(f["errata"]) == 1 and f["errata"][0]["committed_at"] and strip(errata) == strip(before)
        assert "**erratum** commit" in (tmp_path / "erratum" / "pred-tiny.score.md").read_text()
        tl = build_timeline(world["testdir"], repo=Repo(world["work"]))
        assert any(e.kind == "erratum" for e in tl.events)
    finally:
        sim.write_bytes(original)


# ---------------------------------------------------------------------------------------------
# each break of `provenance verify`
# ---------------------------------------------------------------------------------------------
def _copy(world: dict[str, Any], tmp_path: Path) -> Path:
    td = tmp_path / "test"
    shutil.copytree(world["testdir"], td)
    return td


def _breaks(td: Path, world: dict[str, Any]) -> list[str]:
    v = verify_test(td, repo=Repo(world["work"]), code_check=False)
    assert not v.ok
    return [f"{c.name}: {c.detail}" for c in v.breaks]


def test_break_run_bound_to_another_registration(world: dict[str, Any], tmp_path: Path) -> None:
    td = _copy(world, tmp_path)
    other = commit_registration(world["work"], world["bundle"], name="other-reg")
    shutil.rmtree(td / "runs" / "noburst-r1.35-s1")
    run_all(world["test"], td, other, runs=[("noburst", 1.35, 1)])
    br = _breaks(td, world)
    assert any("noburst-r1.35-s1 bound to the registration" in b and "other-reg" in b for b in br), br


def test_break_plan_hash_mismatch(world: dict[str, Any], tmp_path: Path) -> None:
    td = _copy(world, tmp_path)
    edited = write_test(tmp_path / "edited", burst=150, name="tiny-e2")  # the test config changed after registration
    shutil.rmtree(td / "runs" / "burst-r1.35-s0")
    run_all(edited, td, world["binding"], runs=[("burst", 1.35, 0)])
    br = _breaks(td, world)
    assert any("burst-r1.35-s0 plan hash is the registered one" in b for b in br), br


def test_break_plan_file_not_the_one_recorded(world: dict[str, Any], tmp_path: Path) -> None:
    td = _copy(world, tmp_path)
    shutil.copyfile(td / "runs" / "noburst-r1.35-s0" / "plan.parquet", td / "runs" / "burst-r1.35-s0" / "plan.parquet")
    br = _breaks(td, world)
    assert any("burst-r1.35-s0 driven by the frozen plan" in b for b in br), br


def test_break_incomplete_and_missing_runs(world: dict[str, Any], tmp_path: Path) -> None:
    td = _copy(world, tmp_path)
    shutil.rmtree(td / "runs" / "burst-r1.35-s1")
    execute_run(
        world["bundle"], "burst", 1.35, 1, "interrupted", td / "runs" / "burst-r1.35-s1", registration=world["binding"]
    )
    br = _breaks(td, world)
    assert any("burst-r1.35-s1 completed" in b and "INTERRUPTED" in b for b in br), br
    shutil.rmtree(td / "runs" / "burst-r1.35-s1")
    br = _breaks(td, world)
    assert any("every registered run present" in b and "BURST r1.35 s1" in b for b in br), br


def test_break_tampered_registration(world: dict[str, Any], tmp_path: Path) -> None:
    reg = world["work"] / world["binding"]["path"]
    original = reg.read_bytes()
    try:
        reg.write_bytes(original.replace(b"status: FILLED", b"status: FILLED\n# widened after the runs"))
        br = _breaks(world["testdir"], world)
        assert any("work-tree copy unchanged since registration" in b for b in br), br
    finally:
        reg.write_bytes(original)
    assert verify_test(world["testdir"], repo=Repo(world["work"]), code_check=False).ok


def test_break_proof_with_one_altered_byte(world: dict[str, Any], tmp_path: Path) -> None:
    td = _copy(world, tmp_path)
    reg = world["work"] / world["binding"]["path"]
    folder = prove(reg, td / "provenance" / "proofs" / "registration", commit=world["binding"]["commit"])
    assert verify_test(td, repo=Repo(world["work"]), code_check=False).ok
    blob = folder / "objects" / json.loads((folder / "proof.json").read_text())["blob"]
    data = bytearray(blob.read_bytes())
    data[10] ^= 0x20
    blob.write_bytes(bytes(data))
    br = _breaks(td, world)
    assert any(b.startswith("registration (prereg/registrations/tiny-e2.yaml)") and "id recomputed" in b for b in br), (
        br
    )


def _accounting(td: Path, submit: datetime) -> None:
    """An accounting export (UTC) and the manifest's job list for the runs of `td`."""
    from review.records import find_runs

    rows, jobs = [], []
    for i, r in enumerate(find_runs(td)):
        jid = str(5000 + i)
        rows.append(
            {
                "JobID": jid,
                "JobName": r.path.name,
                "Submit": submit.isoformat(),
                "Start": max(submit, r.created_at - timedelta(seconds=1)).isoformat(),
                "End": (r.finished_at + timedelta(seconds=1)).isoformat(),
                "State": "COMPLETED",
                "ExitCode": "0:0",
                "NodeList": "node1",
                "Timelimit": "01:00:00",
                "Elapsed": "00:00:05",
                "Comment": "",
            }
        )
        jobs.append(
            {
                "job_id": jid,
                "arm": r.arm,
                "rate": r.rate,
                "seed": r.seed,
                "plan_sha256": r.plan_sha256,
                "run_dir": f"runs/{r.path.name}",
            }
        )
    (td / "provenance").mkdir(exist_ok=True)
    (td / "provenance" / "accounting.json").write_text(json.dumps({"rows": rows}))
    man = json.loads((td / "submission.json").read_text())
    man["jobs"] = jobs
    (td / "submission.json").write_text(json.dumps(man))


def test_break_job_submitted_before_the_registration_reached_the_remote(world: dict[str, Any], tmp_path: Path) -> None:
    td = _copy(world, tmp_path)
    checked = datetime.fromisoformat(json.loads((td / "submission.json").read_text())["remote_check"]["checked_at"])
    _accounting(td, checked + timedelta(seconds=1))  # submitted after the remote held it: pre-registered, holds
    v = verify_test(td, repo=Repo(world["work"]), code_check=False)
    assert v.ok and v.timeline is not None and v.timeline.label == "pre-registered", v.text()
    _accounting(td, checked - timedelta(seconds=1))  # the first job went in before the remote held it
    br = _breaks(td, world)
    assert any("claimed label 'pre-registered' is the record's" in b and "registered" in b for b in br), br
    tl = build_timeline(td, repo=Repo(world["work"]))
    assert tl.label == "registered" and "confirmed on the remote only at" in tl.label_reason


def test_code_commit_must_be_the_registrations_or_a_code_free_descendant(world: dict[str, Any]) -> None:
    from review.verify import _code_check

    repo = Repo(world["work"])
    reg = world["binding"]["commit"]
    git(world["work"], "commit", "-q", "--allow-empty", "-m", "notes only")
    docs_only = repo.head()
    ok, why = _code_check(repo, {"provenance": {"git": {"commit": docs_only, "dirty": False}}}, reg)
    assert ok and "changes no code" in why
    (world["work"] / "harness").mkdir(exist_ok=True)
    (world["work"] / "harness" / "x.py").write_text("x = 1\n")
    git(world["work"], "add", "harness/x.py")
    git(world["work"], "commit", "-q", "-m", "code change")
    ok, why = _code_check(repo, {"provenance": {"git": {"commit": repo.head(), "dirty": False}}}, reg)
    assert not ok and "harness/x.py" in why
    ok, why = _code_check(repo, {"provenance": {"git": {"commit": reg, "dirty": True}}}, reg)
    assert not ok and "dirty" in why
    git(world["work"], "reset", "-q", "--hard", docs_only)
