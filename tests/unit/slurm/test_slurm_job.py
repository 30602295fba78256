"""The job script's checks, the time budget, the submission's refusals and the label from a
manifest, without a cluster: jobs run in this process against a fixture repository that holds the
project's code and registrations filled by formula (tests/support/slurm_fixture.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.gitfixture import git
from support.slurm_fixture import commit, fill, make_project

from harness.recording.record import load_run
from prereg.registration import load_registration, registration_dict, write_registration
from slurm import job as J
from slurm.budget import Budget, job_time_limit, parse_time_minutes, run_budget, warning_lead_s
from slurm.checks import SchedulerFacts, time_check
from slurm.job_options import JobOptions
from slurm.manifest import label_from_record
from slurm.submit import SubmitOptions, SubmitRefused, format_plan, plan_submission


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fixture project with a one-job registration (NOBURST at 1.75 x lambda_ref, seed 3),
    committed and pushed, and a copy whose registered plan hash is wrong."""
    tmp = tmp_path_factory.mktemp("slurm-job")
    work, remote = make_project(tmp)
    reg = fill(work, "mini-one", seeds="[3]", arms="[noburst]")
    data = registration_dict(load_registration(reg))
    data["name"] = "mini-badplan"
    data["plans"][0]["sha256"] = "0" * 64
    bad = reg.with_name("mini-badplan.yaml")
    write_registration(data, bad)
    c = commit(work, "register mini-one and mini-badplan", push=True)
    return {"tmp": tmp, "work": work, "remote": remote, "reg": reg, "bad": bad, "commit": c}


def _spec(p: dict[str, Any], run_dir: Path, **kw: Any) -> J.JobSpec:
    reg = load_registration(p["reg"])
    base = {
        "registration": "prereg/registrations/mini-one.yaml",
        "sha256": reg.sha256,
        "arm": "noburst",
        "rate": 1.75,
        "seed": 3,
        "run_dir": str(run_dir),
        "engine": "sim",
        "commit": p["commit"],
    }
    base.update(kw)
    return J.JobSpec(**base)


def _refused(out: J.JobOutcome, check: str) -> dict[str, Any]:
    assert out.status == "REFUSED" and out.exit_code == J.JobExit.REFUSED and out.check == check, out
    meta = orjson.loads((Path(out.run_dir) / "meta.json").read_bytes())
    assert meta["status"] == "REFUSED" and meta["status_reason"] == out.reason and meta["refusal"]["check"] == check
    assert meta["tables"] is not None and all(t["rows"] == 0 for t in meta["tables"].values())  # a readable, empty run
    return meta


# -------------------------------------------------------------------------------------- the budget
def test_budget_is_the_duration_over_the_time_scale_plus_the_allowances() -> None:
    allow = {"start_s": 900.0, "smoke_s": 120.0, "teardown_s": 60.0}  # Decision 16's defaults
    real = run_budget(8700.0, allow, "sglang", None)  # the paper's E2 run on a real engine
    assert (real.time_scale, real.run_s, real.needed_s) == (1.0, 8700.0, 8700.0 + 900 + 120 + 60)
    emu = run_budget(8700.0, allow, "emulator", 50.0)
    assert emu.run_s == 8700.0 / 50 and emu.needed_s == 8700.0 / 50 + 1080
    sim = run_budget(8700.0, allow, "sim", None)
    assert sim.time_scale is None and sim.needed_s == 1080  # virtual time: only the allowances
    with pytest.raises(ValueError, match="emulator only"):
        run_budget(8700.0, allow, "vllm", 10.0)


def test_time_limit_covers_need_lead_slack_and_margin() -> None:
    b = run_budget(1800.0, {"start_s": 30.0, "smoke_s": 20.0, "teardown_s": 10.0}, "emulator", 60.0)
    tl = job_time_limit(b)
    want = b.needed_s * 1.1 + 60 + 60  # margin, warning lead, scheduler slack
    assert tl.minutes == math.ceil(want / 60) and tl.fits and tl.source == "protocol"
    assert tl.slurm == f"00:{tl.minutes:02d}:00" and tl.warning_lead_s == 60
    short = job_time_limit(b, 1)
    assert not short.fits and short.source == "--time" and short.warning_lead_s == warning_lead_s(60) == 15
    assert parse_time_minutes("2:15:00") == 135 and parse_time_minutes("90") == 90 and parse_time_minutes("0:30") == 1
    with pytest.raises(ValueError):
        parse_time_minutes("soon")


def test_time_check_reproduces_the_papers_refused_job() -> None:
    """App. E.11: a job needing 7080 s with 5369 s left of its 01:30:00 limit started nothing; the
    same job resubmitted with --time 02:15:00 ran. (The paper's jobs had no warning lead.)"""
    need = Budget("sglang", 6000.0, 1.0, 6000.0, 900.0, 120.0, 60.0)
    assert need.needed_s == 7080
    refused = time_check(SchedulerFacts(True, time_left_s=5369.0, time_left="1:29:29"), need, 0.0)
    ran = time_check(SchedulerFacts(True, time_left_s=8100.0 - 31, time_left="2:14:29"), need, 0.0)
    assert refused.ok is False and ran.ok is True and refused.required_s == 7080
    assert refused.to_json()["required_s"] == 7080 and "problem" not in refused.to_json()
    assert time_check(SchedulerFacts(False), need, 60.0).ok  # no scheduler, no limit
    assert time_check(SchedulerFacts(True, unlimited=True), need, 60.0).ok
    unread = time_check(SchedulerFacts(True, error="squeue: unreachable"), need, 60.0)
    assert not unread.ok and "squeue: unreachable" in unread.to_json()["problem"]


# ---------------------------------------------------------------------------------- the job script
def test_job_runs_binds_and_says_so(project: dict[str, Any], tmp_path: Path) -> None:
    out = J.run_job(_spec(project, tmp_path / "run"), code_root=project["work"])
    assert out.status == "COMPLETED" and out.exit_code == 0, out
    run = load_run(tmp_path / "run")
    m = run.meta
    reg = load_registration(project["reg"])
    assert m["registration"] == {
        **reg.binding("prereg/registrations/mini-one.yaml", project["commit"]),
        "status": "FILLED",
        "expected_sha256": reg.sha256,
    }
    assert m["plan"]["sha256"] == reg.plan_sha256("noburst", 1.75, 3) and m["plan_check"]["ok"]
    assert m["code"]["relation"] == "same" and m["code"]["registration_commit"] == project["commit"]
    assert m["time_check"]["source"].startswith("none") and m["time_check"]["needed_s"] == 60.0
    assert m["job"]["outcome"] == "COMPLETED" and m["job"]["executor"] == "local" and m["test"] == reg.test
    assert len(run.turns) > 0 and not run.partial


def test_job_refuses_a_missing_registration(project: dict[str, Any], tmp_path: Path) -> None:
    out = J.run_job(
        _spec(project, tmp_path / "run", registration="prereg/registrations/gone.yaml"), code_root=project["work"]
    )
    meta = _refused(out, "registration-missing")
    assert "registration prereg/registrations/gone.yaml is missing" in out.reason and meta["job"]["spec"]["seed"] == 3


def test_job_refuses_another_hash(project: dict[str, Any], tmp_path: Path) -> None:
    out = J.run_job(_spec(project, tmp_path / "run", sha256="ab" * 32), code_root=project["work"])
    _refused(out, "registration-hash")
    assert f"expected {'ab' * 32}" in out.reason


def test_job_refuses_an_unregistered_run_and_a_status_other_than_filled(
    project: dict[str, Any], tmp_path: Path
) -> None:
    out = J.run_job(_spec(project, tmp_path / "a", seed=4), code_root=project["work"])
    _refused(out, "not-registered")
    assert "seeds [3]" in out.reason


def test_job_refuses_a_plan_mismatch(project: dict[str, Any], tmp_path: Path) -> None:
    reg = load_registration(project["bad"])
    spec = _spec(project, tmp_path / "run", registration="prereg/registrations/mini-badplan.yaml", sha256=reg.sha256)
    out = J.run_job(spec, code_root=project["work"])
    meta = _refused(out, "plan")
    assert meta["plan_check"]["registered"] == "0" * 64 and meta["plan_check"]["generated"] in out.reason
    assert meta["plan"]["sha256"] == meta["plan_check"]["generated"]  # the plan was frozen and hashed, not driven


def test_job_refuses_too_little_time(project: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = SchedulerFacts(True, job_id="123", job_label="123", time_left_s=100.0, time_left="1:40")
    monkeypatch.setattr(J, "scheduler_facts", lambda: dataclasses.replace(facts))
    out = J.run_job(_spec(project, tmp_path / "run", warning_lead_s=60.0), code_root=project["work"])
    meta = _refused(out, "time")
    assert "100 s left in the job, 120 s needed" in out.reason and meta["time_check"]["required_s"] == 120.0
    facts.time_left_s = 120.0  # exactly enough runs
    assert (
        J.run_job(_spec(project, tmp_path / "run2", warning_lead_s=60.0), code_root=project["work"]).status
        == "COMPLETED"
    )


def test_job_never_overwrites_a_run(project: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "meta.json").write_text("{}")
    out = J.run_job(_spec(project, tmp_path / "run"), code_root=project["work"])
    assert out.status == "REFUSED" and out.check == "run-dir" and (tmp_path / "run" / "meta.json").read_text() == "{}"


def test_job_code_check_descendants_and_changes(project: dict[str, Any], tmp_path: Path) -> None:
    work = project["work"]
    try:
        (work / "NOTES.md").write_text("a note, not code\n")
        (work / "prereg" / "registrations" / "another.yaml").write_text("a later registration is data, not code\n")
        later = commit(work, "a note and another registration")
        ok = J.run_job(_spec(project, tmp_path / "a"), code_root=work)
        assert ok.status == "COMPLETED" and "a descendant of the registration's commit" in ok.notes[0]
        code = load_run(tmp_path / "a").meta["code"]
        assert (
            code["relation"] == "descendant without code changes"
            and code["head"] == later
            and code["changed_paths"] == ["NOTES.md", "prereg/registrations/another.yaml"]
        )

        p = work / "harness" / "config" / "models.py"
        p.write_text(p.read_text() + "\n# an uncommitted edit\n")
        out = J.run_job(_spec(project, tmp_path / "b"), code_root=work)
        _refused(out, "code")
        assert "uncommitted code changes: ['harness/config/models.py']" in out.reason
        moved = commit(work, "a code change")
        out = J.run_job(_spec(project, tmp_path / "c"), code_root=work)
        _refused(out, "code")
        assert f"commit {moved[:12]} changes ['harness/config/models.py']" in out.reason
        # the submission refuses it first, with the job's reason and what to do (nothing is written)
        with pytest.raises(SubmitRefused) as refused:
            plan_submission(project["reg"], SubmitOptions(engine="sim", dry_run=True, out=str(tmp_path / "t")))
        msg = str(refused.value)
        assert "every job would refuse" in msg and f"commit {moved[:12]} changes" in msg
        assert f"git worktree add DIR {project['commit'][:12]}" in msg and not (tmp_path / "t").exists()
        doc = plan_submission(
            project["reg"], SubmitOptions(engine="sim", dry_run=True, exploratory=True, out=str(tmp_path / "t"))
        )
        assert len(doc["jobs"]) == 1  # an exploratory submission is not refused (its jobs record the relation)
        # an exploratory job runs anyway and records why it would have been refused
        out = J.run_job(_spec(project, tmp_path / "d", exploratory=True), code_root=work)
        assert out.status == "COMPLETED" and load_run(tmp_path / "d").meta["code"]["relation"] == "exploratory"
    finally:
        git(work, "reset", "-q", "--hard", project["commit"])


def test_job_cli_and_entry_exit_statuses(
    project: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(J, "CODE_ROOT", project["work"])
    spec = _spec(project, tmp_path / "run", sha256="cd" * 32)
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec.to_json()))
    assert J.main(["--spec", str(f)]) == J.JobExit.REFUSED
    with pytest.raises(SystemExit) as exc:
        J.JobEntry(_spec(project, tmp_path / "run2", sha256="cd" * 32).to_json())()
    assert exc.value.code == J.JobExit.REFUSED
    assert J.main(["--registration", "x.yaml"]) == J.JobExit.REFUSED  # incomplete arguments are refused, not guessed


# ------------------------------------------------------------------------------------ submission
def test_submission_plan_and_refusals(project: dict[str, Any], tmp_path: Path) -> None:
    work = project["work"]
    doc = plan_submission(
        project["reg"], SubmitOptions(engine="emulator", time_scale=60.0, dry_run=True, out=str(tmp_path / "t"))
    )
    reg = load_registration(project["reg"])
    assert (
        doc["registration"]["commit"] == project["commit"] and doc["remote"]["contains"] and doc["remote"]["checked_at"]
    )
    (job,) = doc["jobs"]
    assert (job["arm"], job["rate"], job["seed"], job["plan_sha256"]) == (
        "noburst",
        1.75,
        3,
        reg.plan_sha256("noburst", 1.75, 3),
    )
    assert (
        job["spec"]["time_scale"] == 60.0
        and job["spec"]["commit"] == project["commit"]
        and job["run_dir"] == "runs/noburst-r1.75-s3"
    )
    assert doc["time_limit"]["needed_s"] == 1800 / 60 + 60 and doc["comment"].endswith(f"sha256={reg.sha256}")
    assert "label    pre-registered" in format_plan(doc)
    warned: list[str] = []
    plan_submission(
        project["reg"],
        SubmitOptions(
            engine="emulator", time_scale=60.0, job=JobOptions(time="1"), dry_run=True, out=str(tmp_path / "t")
        ),
        echo=warned.append,
    )
    assert any("every job will refuse to run" in w for w in warned)
    # the dry run shows the sbatch script submitit would submit, with every job option
    job = JobOptions(
        gres="gpu:1", account="acct", qos="high", mem="64G", partition="gpu", job_env={"HF_HOME": "/scratch/hf"}
    )
    dry = plan_submission(
        project["reg"],
        SubmitOptions(engine="emulator", time_scale=60.0, job=job, dry_run=True, out=str(tmp_path / "t")),
    )
    script = dry["sbatch_script"]
    for line in (
        "#SBATCH --gres=gpu:1",
        "#SBATCH --account=acct",
        "#SBATCH --qos=high",
        "#SBATCH --mem=64G",
        "#SBATCH --partition=gpu",
        f"#SBATCH --time={dry['time_limit']['minutes']}",
        f"#SBATCH --signal=URG@{dry['time_limit']['warning_lead_s']}",
        "export HF_HOME=/scratch/hf",
        f"#SBATCH --chdir={work}",
        "#SBATCH --hold",  # released once submitit has made the job's log folder
        "submitit.core._submit",
    ):
        assert line in script, (line, script)
    assert script.rstrip() in format_plan(dry) and "--array" not in script  # one job: no array
    # never committed: refused, or exploratory with --exploratory
    new = fill(work, "mini-new", seeds="[3]", arms="[noburst]")
    try:
        with pytest.raises(SubmitRefused, match="is not committed"):
            plan_submission(new, SubmitOptions(engine="sim", dry_run=True))
        doc = plan_submission(new, SubmitOptions(engine="sim", dry_run=True, exploratory=True))
        assert (
            doc["check"]["label_if_submitted_now"]["label"] == "exploratory" and doc["jobs"][0]["spec"]["exploratory"]
        )
        assert doc["registration"]["commit"] is None and any(
            "not committed" in w for w in doc["check"]["refusals_waived"]
        )
    finally:
        new.unlink()
        (work / "prereg" / "templates" / "mini-new.yaml").unlink()
    with pytest.raises(SubmitRefused, match=r"plan noburst x 1\.75 seed 3: registered SHA-256 0{64}"):
        plan_submission(project["bad"], SubmitOptions(engine="sim", dry_run=True, exploratory=True))  # never waived


# ------------------------------------------------------------------------------------- the label
CDT = timezone(timedelta(hours=-5))


def _doc(
    commit_t: datetime | None, confirmed: datetime | None, contains: bool, status: str = "FILLED"
) -> dict[str, Any]:
    return {
        "registration": {
            "status": status,
            "committed": commit_t is not None,
            "clean": True,
            "commit_time": commit_t.isoformat() if commit_t else None,
        },
        "remote": {"contains": contains, "checked_at": confirmed.isoformat() if confirmed else None},
    }


def test_label_from_the_manifest_and_the_schedulers_submit_times() -> None:
    """Table 14-17 timelines (CDT): E2 committed 15:09:12, pushed 15:09:54, first job submitted
    15:13:39 -> pre-registered; vLLM E2 committed 16:23:59, first submitted 16:24:36, pushed
    16:26:35 -> registered."""
    d = datetime(2026, 10, 24, tzinfo=CDT)
    e2 = _doc(d.replace(hour=15, minute=9, second=12), d.replace(hour=15, minute=9, second=54), True)
    subs = [d.replace(hour=15, minute=13, second=39), d.replace(hour=15, minute=14)]
    lab = label_from_record(e2, subs)
    assert lab.label == "pre-registered" and lab.facts["first_submit"] == "2026-10-24T20:13:39+00:00"
    v = datetime(2026, 10, 30, tzinfo=CDT)
    vllm = _doc(v.replace(hour=16, minute=23, second=59), v.replace(hour=16, minute=24, second=30), False)
    later = {"contains": True, "checked_at": v.replace(hour=16, minute=26, second=35).isoformat()}
    lab = label_from_record(vllm, [v.replace(hour=16, minute=24, second=36).isoformat()], later)
    assert lab.label == "registered" and "confirmed on the remote only at 2026-10-30T21:26:35+00:00" in lab.reason
    assert label_from_record(vllm, [v.replace(hour=16, minute=24, second=36)]).label == "registered"
    assert label_from_record(_doc(None, None, False), [v]).label == "exploratory"
    assert label_from_record(_doc(d, d, True, status="EXPLORATORY"), [d + timedelta(hours=1)]).label == "exploratory"


# -------------------------------------------------------------------------------- collection
def test_the_export_is_checked_against_the_manifest() -> None:
    from slurm.collect import agreement
    from slurm.parsers import AccountingRow

    t = datetime(2026, 12, 1, 6, 19, 7, tzinfo=UTC)
    doc = {
        "comment": "agentload registration x sha256=ab",
        "job_name": "agentload-x",
        "time_limit": {"seconds": 240.0, "slurm": "00:04:00"},
        "jobs": [
            {"job_id": "5_0", "arm": "burst", "rate": 1.5, "seed": 3, "submit_utc": t.isoformat()},
            {"job_id": "5_1", "arm": "capped", "rate": 1.5, "seed": 3, "submit_utc": t.isoformat()},
        ],
    }

    def row(jid: str, **kw: Any) -> AccountingRow:
        base = {
            "job_id": jid,
            "job_name": "agentload-x",
            "submit": t,
            "start": t,
            "end": t,
            "state": "COMPLETED",
            "state_raw": "COMPLETED",
            "exit_code": 0,
            "exit_signal": 0,
            "node_list": "vm",
            "timelimit": "00:04:00",
            "timelimit_s": 240.0,
            "elapsed": "00:00:01",
            "elapsed_s": 1.0,
            "comment": "agentload registration x sha256=ab",
        }
        base.update(kw)
        return AccountingRow(**base)

    assert agreement(doc, [row("5_0"), row("5_1")]) == []
    probs = agreement(doc, [row("5_0", comment="other", timelimit="00:05:00", timelimit_s=300.0), row("7")])
    assert any("5_0: comment 'other'" in p for p in probs) and any("5_0: time limit '00:05:00'" in p for p in probs)
    assert any("5_1 (capped x 1.5 seed 3): no accounting row" in p for p in probs) and any(
        "not in the manifest: ['7']" in p for p in probs
    )
