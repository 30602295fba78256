"""Registered tests submitted to the local SLURM cluster: the done-criteria of slurm/README.md.

Against the real cluster (slurmctld, slurmd, slurmdbd on MariaDB) and a fixture repository that
holds a copy of the project's code and registrations filled by formula (tests/support/slurm_fixture.py),
committed and pushed to a bare remote, so every job runs the code of its registration's commit:

* a registered mini E2 (BURST, NOBURST, CAPPED at 1.5 x lambda_ref, seed 3, the E2 rule judged on
  one seed) on the emulator at a high time scale, one job per arm: collected, its registered
  verdict (PASS) equals the same registration run locally (`--executor local`) in the simulator;
  sacct has every job, the export agrees with the manifest, the label is pre-registered;
* one job each refused for a missing registration, another hash, a plan mismatch and too little
  time (`--time 1`): exit status 3, the reason in the job log and in a REFUSED run directory;
* a job cancelled mid-run: INTERRUPTED, its records kept;
* labels: pushed after submission -> registered; never committed -> refused, or exploratory with
  --exploratory;
* `test run --engine sim --executor slurm` and `calibrate stage-c --executor slurm`: byte-identical
  run tables and the same verdict / statistics as the local run;
* one real vLLM job (AGENTLOAD_VLLM_PYTHON; skipped without it): its server launched, smoke and
  canary passed, a short arm completed. It is submitted early and collected last, while the
  deterministic simulator jobs run beside it.

Time on an otherwise idle 2-core machine: about 5 minutes, most of it the emulator's three runs
(1800 plan seconds each at time scale 40; see `_e2_scale`: 10 on a machine whose load exceeds its
cores, where the E2 alone takes about 7 minutes) and the vLLM server's start (25-90 s idle, up to
4 minutes on a loaded machine), which overlaps the simulator jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from support.gitfixture import git
from support.slurm_fixture import commit, fill, make_project, one_seed_rule, tiny_vllm

from cli.main import main
from harness.recording.record import load_run
from prereg.registration import load_registration, registration_dict, write_registration
from slurm import accounting_export as X
from slurm import scheduler as S

pytestmark = [pytest.mark.slurm, pytest.mark.wallclock, pytest.mark.usefixtures("slurm_cluster")]

ROOT = Path(__file__).resolve().parents[2]


def _e2_scale() -> float:
    """The emulator's time scale for the E2: AGENTLOAD_SLURM_E2_SCALE, else 40 on a machine that is
    not oversubscribed and 10 on one that is (1-minute load average above the core count). A run
    needs about 11 CPU seconds whatever the scale; what a high scale cannot stand is the client or
    the server waiting for a core (session starts then run late and a starved engine model
    processes fewer tokens per plan second), so a busy machine gets a slower, faithful clock."""
    if os.environ.get("AGENTLOAD_SLURM_E2_SCALE"):
        return float(os.environ["AGENTLOAD_SLURM_E2_SCALE"])
    return 40.0 if os.getloadavg()[0] <= (os.cpu_count() or 1) else 10.0


E2_SCALE = _e2_scale()


def _json(p: Path) -> Any:
    return json.loads(p.read_text())


def _meta(run: Path) -> dict[str, Any]:
    return orjson.loads((run / "meta.json").read_bytes())


def _cli(*argv: str) -> int:
    return main([str(a) for a in argv])


def _json_status(testdir: Path) -> dict[str, Any]:
    from slurm.collect import status

    return status(testdir / "submission.json")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("submit")
    work, remote = make_project(tmp)
    rule = one_seed_rule(work)
    regs = {
        "e2": fill(work, "e2-mini", seeds="[3]", fractions="[[1, 2]]", rule=rule),
        "one": fill(work, "one-mini", seeds="[3]", arms="[noburst]"),
        "vllm": tiny_vllm(work),
    }
    data = registration_dict(load_registration(regs["one"]))
    data["name"] = "one-badplan"
    data["plans"][0]["sha256"] = "0" * 64
    regs["bad"] = regs["one"].with_name("one-badplan.yaml")
    write_registration(data, regs["bad"])
    c = commit(work, "register the test registrations", push=True)
    return {"tmp": tmp, "work": work, "remote": remote, "regs": regs, "commit": c}


# -------------------------------------------------------------------------------- registered E2
@pytest.mark.timeout(900)
def test_registered_e2_on_the_cluster_equals_the_local_run(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    reg_path = project["regs"]["e2"]
    reg = load_registration(reg_path)
    t_slurm, t_local = project["tmp"] / "e2-slurm", project["tmp"] / "e2-local"
    t0 = time.monotonic()
    assert (
        _cli("submit", reg_path, "--engine", "emulator", "--time-scale", E2_SCALE, "--parallel", "2", "--out", t_slurm)
        == 0
    )
    manifest = _json(t_slurm / "submission.json")
    ids = [j["job_id"] for j in manifest["jobs"]]
    assert [(j["arm"], j["rate"], j["seed"]) for j in manifest["jobs"]] == [(p.arm, p.rate, p.seed) for p in reg.plans]
    assert manifest["label_at_submission"]["label"] == "pre-registered" and manifest["remote"]["contains"]
    assert all(j["submit_utc"] for j in manifest["jobs"]) and len({j["array_job_id"] for j in manifest["jobs"]}) == 1
    rc = _cli("jobs", "collect", t_slurm / "submission.json", "--wait", "600")
    out = capsys.readouterr().out
    print(out)
    col = _json(t_slurm / "collection.json")
    assert col["complete"] and not col["not_completed"], col["not_completed"]
    assert col["agreement"] == [] and rc == 0
    assert col["label"]["label"] == "pre-registered"
    rows = X.read_accounting_export(t_slurm / "provenance" / "accounting.json")
    assert [r.job_id for r in rows] == ids and all(r.state == "COMPLETED" and r.exit_code == 0 for r in rows)
    assert all(r.comment == manifest["comment"] and r.timelimit_s == manifest["time_limit"]["seconds"] for r in rows)
    assert [r.job_id for r in X.read_accounting_export(t_slurm / "provenance" / "accounting.csv")] == ids
    for j in manifest["jobs"]:  # every run bound, on a fresh server that passed its checks
        m = _meta(t_slurm / j["run_dir"])
        assert m["registration"]["sha256"] == reg.sha256 and m["registration"]["commit"] == project["commit"]
        assert m["preflight"]["smoke"]["passed"] and m["preflight"]["canary"]["passed"] and m["plan_check"]["ok"]
        assert (
            m["job"]["job_label"] == j["job_id"] and m["job"]["array_task_id"] == j["index"] and m["time_check"]["ok"]
        )
    cluster_s = time.monotonic() - t0
    assert _cli("submit", reg_path, "--executor", "local", "--engine", "sim", "--parallel", "2", "--out", t_local) == 0
    _cli("jobs", "collect", t_local / "submission.json")
    capsys.readouterr()
    here = _json(t_local / "collection.json")["analysis"]
    there = col["analysis"]
    print(
        f"cluster ({cluster_s:.0f} s, emulator x{E2_SCALE:g}): {there['verdict']} {there['rates']}\n"
        f"local (simulator): {here['verdict']} {here['rates']}"
    )
    assert there["runs_counted"] == here["runs_counted"] == 3 and there["decisive"] and here["decisive"]
    lateness = {j["arm"]: (_meta(t_slurm / j["run_dir"]).get("open_loop") or {}) for j in manifest["jobs"]}
    why = "; ".join(
        f"{a}: session starts late p99 {o.get('p99_s', float('nan')):.2f} plan s (bound {o.get('bound_p99_s')}, "
        f"within: {o.get('within_bound')})"
        for a, o in lateness.items()
    )
    assert there["rates"] == here["rates"] and there["verdict"] == here["verdict"], (
        f"the emulator at x{E2_SCALE:g} did not reproduce the simulator ({why}); "
        "on a loaded machine lower AGENTLOAD_SLURM_E2_SCALE"
    )


# ------------------------------------------------------------------------------ the vLLM job
@pytest.fixture(scope="module")
def vllm_submission(project: dict[str, Any]) -> Iterator[Path]:
    python = os.environ.get("AGENTLOAD_VLLM_PYTHON")
    if not python:
        pytest.skip(
            "AGENTLOAD_VLLM_PYTHON is unset: the real-vLLM job needs the engine venv "
            "(scripts/ci-engine-tests.sh sets it up)"
        )
    from harness.servers.vllm import private_cache_env

    model = os.environ.get("AGENTLOAD_TINY_MODEL")
    if not (model and (Path(model) / "config.json").exists()):
        model = str(project["tmp"] / "tiny-model")
        subprocess.run(
            [python, str(ROOT / "harness/servers/tiny_model.py"), model], check=True, capture_output=True, timeout=300
        )
    cache = Path(os.environ.get("AGENTLOAD_ENGINE_CACHE") or project["tmp"] / "engine-cache")
    env = [f"--job-env={k}={v}" for k, v in private_cache_env(cache).items()]
    out = project["tmp"] / "vllm"
    rc = _cli(
        "submit",
        project["regs"]["vllm"],
        "--engine",
        "vllm",
        "--server-cmd",
        f"{python} -m vllm.entrypoints.openai.api_server",
        "--model-path",
        model,
        "--health-timeout",
        "600",
        *env,
        "--out",
        out,
    )
    assert rc == 0
    yield out / "submission.json"
    for j in _json(out / "submission.json")["jobs"]:
        subprocess.run(["scancel", str(j["job_id"])], capture_output=True)


def test_vllm_job_is_submitted(vllm_submission: Path) -> None:
    doc = _json(vllm_submission)
    (j,) = doc["jobs"]
    assert j["job_id"] and doc["arguments"]["engine"] == "vllm" and doc["budget"]["time_scale"] == 1.0


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.timeout(300)
def test_jobs_refuse_and_say_why(project: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Missing registration, another hash and a plan mismatch (job specs submitted directly, as
    a hand-written sbatch line would), and too little time (`agentload submit --time 1`)."""
    from slurm.executors import slurm_executor, submit_slurm
    from slurm.job import JobSpec

    work, tmp = project["work"], project["tmp"] / "refusals"
    one = load_registration(project["regs"]["one"])
    bad = load_registration(project["regs"]["bad"])
    base = {
        "arm": "noburst",
        "rate": 1.75,
        "seed": 3,
        "engine": "emulator",
        "time_scale": 60.0,
        "commit": project["commit"],
        "warning_lead_s": 30.0,
    }
    specs = [
        JobSpec(
            registration="prereg/registrations/not-there.yaml",
            sha256=one.sha256,
            run_dir=str(tmp / "runs" / "missing"),
            index=0,
            **base,
        ),
        JobSpec(
            registration="prereg/registrations/one-mini.yaml",
            sha256="ab" * 32,
            run_dir=str(tmp / "runs" / "hash"),
            index=1,
            **base,
        ),
        JobSpec(
            registration="prereg/registrations/one-badplan.yaml",
            sha256=bad.sha256,
            run_dir=str(tmp / "runs" / "plan"),
            index=2,
            **base,
        ),
    ]
    ex = slurm_executor(
        tmp / "jobs",
        time_min=4,
        warning_lead_s=30,
        checkout=work,
        comment="refusal test",
        job_name="agentload-refusals",
    )
    recs = submit_slurm(specs, ex)
    assert (
        _cli(
            "submit",
            project["regs"]["one"],
            "--engine",
            "emulator",
            "--time-scale",
            "60",
            "--time",
            "1",
            "--out",
            tmp / "short",
        )
        == 0
    )
    short = _json(tmp / "short" / "submission.json")
    assert not short["time_limit"]["fits"] and short["time_limit"]["minutes"] == 1
    capsys.readouterr()
    rows = {
        r.job_id: r
        for r in S.wait_for_accounting(
            [r["job_id"] for r in recs] + [short["jobs"][0]["job_id"]], count=4, timeout_s=180
        )
    }
    for rec, (name, check, words) in zip(
        recs,
        [
            ("missing", "registration-missing", "prereg/registrations/not-there.yaml is missing"),
            ("hash", "registration-hash", f"expected {'ab' * 32}"),
            ("plan", "plan", "differs from the registered " + "0" * 64),
        ],
    ):
        r = rows[rec["job_id"]]
        assert (r.state, r.exit_code) == ("FAILED", 3), (name, r)
        m = _meta(tmp / "runs" / name)
        assert m["status"] == "REFUSED" and m["refusal"]["check"] == check and words in m["status_reason"], m[
            "status_reason"
        ]
        log = Path(rec["stderr"]).read_text()
        assert f"REFUSED ({check})" in log and words in log
    assert _cli("jobs", "collect", tmp / "short" / "submission.json") == 1
    col = _json(tmp / "short" / "collection.json")
    (nc,) = col["not_completed"]
    assert (
        nc["state"] == "FAILED"
        and nc["exit_code"] == 3
        and nc["refused_by"] == "time"
        and "too little time" in nc["reason"]
    )
    assert col["agreement"] == [] and "0 run(s) counted" in capsys.readouterr().out
    m = _meta(tmp / "short" / "runs" / "noburst-r1.75-s3")
    tc = m["time_check"]
    assert (
        tc["time_left_s"] <= 60 and tc["needed_s"] == 1800 / 60 + 60 and not tc["ok"] and m["job"]["time_limit_s"] == 60
    )


# -------------------------------------------------------------------------------- cancelled job
@pytest.mark.timeout(300)
def test_a_cancelled_job_ends_interrupted_with_its_records(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = project["tmp"] / "cancel"
    assert _cli("submit", project["regs"]["one"], "--engine", "emulator", "--time-scale", "10", "--out", out) == 0
    (j,) = _json(out / "submission.json")["jobs"]
    turns = out / j["run_dir"] / "turns.jsonl"
    deadline = time.monotonic() + 180
    while not (turns.exists() and turns.read_bytes().count(b"\n") >= 50):
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.5)
    assert _cli("jobs", "status", out / "submission.json") == 0
    printed = capsys.readouterr().out
    assert j["job_id"] in printed and "RUNNING" in printed
    st = _json_status(out)
    assert st["jobs"][0]["state"] == "RUNNING" and st["jobs"][0]["run_status"] == "RUNNING"
    subprocess.run(["scancel", j["job_id"]], check=True)
    assert _cli("jobs", "collect", out / "submission.json", "--wait", "120", "--no-analysis") == 1
    capsys.readouterr()
    col = _json(out / "collection.json")
    (nc,) = col["not_completed"]
    assert nc["state"] == "CANCELLED" and nc["run_status"] == "INTERRUPTED" and "SIGTERM" in nc["reason"]
    run = load_run(out / j["run_dir"])
    assert run.status == "INTERRUPTED" and len(run.turns) >= 50 and len(run.sessions) > 0
    assert (
        run.meta["drive"]["status"] == "INTERRUPTED" and run.meta["tables"]
    )  # flushed and compacted before the job ended
    (row,) = X.read_accounting_export(out / "provenance" / "accounting.json")
    assert row.state == "CANCELLED" and row.job_id == j["job_id"]


# ------------------------------------------------------------------------------------- labels
@pytest.mark.timeout(300)
def test_labels_from_the_record(project: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    work, tmp = project["work"], project["tmp"] / "labels"
    later = fill(work, "later-mini", seeds="[3]", arms="[noburst]")
    commit(work, "register later-mini, not pushed yet")
    assert _cli("submit", later, "--engine", "sim", "--out", tmp / "later") == 0
    doc = _json(tmp / "later" / "submission.json")
    assert not doc["remote"]["contains"] and doc["label_at_submission"]["label"] == "registered"
    git(work, "push", "-q", "origin", "main")
    assert _cli("jobs", "collect", tmp / "later" / "submission.json", "--wait", "120") == 0
    lab = _json(tmp / "later" / "collection.json")["label"]
    assert lab["label"] == "registered" and "confirmed on the remote only at" in lab["reason"], lab

    never = fill(work, "never-mini", seeds="[3]", arms="[noburst]")
    capsys.readouterr()
    assert _cli("submit", never, "--engine", "sim", "--out", tmp / "never") == 2
    err = capsys.readouterr().err
    assert (
        "submission refused" in err and "is not committed" in err and not (tmp / "never" / "submission.json").exists()
    )
    assert _cli("submit", never, "--engine", "sim", "--exploratory", "--out", tmp / "never-x") == 0
    assert _json(tmp / "never-x" / "submission.json")["label_at_submission"]["label"] == "exploratory"
    assert _cli("jobs", "collect", tmp / "never-x" / "submission.json", "--wait", "120") == 0
    col = _json(tmp / "never-x" / "collection.json")
    assert (
        col["label"]["label"] == "exploratory" and not col["not_completed"] and not col["analysis"]["decisive"]
    )  # ran; decides nothing
    m = _meta(tmp / "never-x" / "runs" / "noburst-r1.75-s3")
    assert m["status"] == "COMPLETED" and m["code"]["relation"] == "exploratory" and m["registration"]["commit"] is None
    never.unlink()
    (work / "prereg" / "templates" / "never-mini.yaml").unlink()


# ------------------------------------------------------------------------------------- sweeps
SWEEP_PROTOCOL = {
    "kind": "protocol",
    "name": "sweep",
    "description": "short runs",
    "duration": 600.0,
    "burst": {"time": 100.0, "size": 20, "width": 30.0},
    "window": {"start": 300.0, "end": 600.0},
    "min_window": 300.0,
    "backlog_bin": 10.0,
    "hit_bin": 100.0,
    "recovered_span": 100.0,
    "gauge_interval": 5.0,
}


@pytest.mark.timeout(300)
def test_sweeps_on_the_cluster_equal_the_local_runs(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.rules import load_rule

    d = project["tmp"] / "sweep"
    shutil.rmtree(d, ignore_errors=True)  # a rerun (the wallclock marker) starts over in the shared project
    d.mkdir()
    (d / "sweep.yaml").write_text(yaml.safe_dump(SWEEP_PROTOCOL))
    e2 = load_rule("e2")
    rule = {
        **e2,
        "params": {**e2["params"], "min_window": 300.0, "recovered_span": 100.0, "min_good_seeds": 2},
        "group": {**e2["group"], "min_seeds": 2},
    }
    (d / "rule.yaml").write_text(yaml.safe_dump(rule))
    (d / "test.yaml").write_text(
        yaml.safe_dump(
            {
                "kind": "test",
                "name": "sweep",
                "cell": "sglang-a100-300k",
                "workload": "standard",
                "protocol": "sweep.yaml",
                "rule": "rule.yaml",
                "arms": ["burst", "noburst", "capped"],
                "rates": [1.35],
                "seeds": [0, 1],
                "cap": 20,
            }
        )
    )
    assert _cli("test", "run", d / "test.yaml", "--engine", "sim", "--plain", "--jobs", "2", "--out", d / "local") in (
        0,
        1,
    )
    assert _cli(
        "test",
        "run",
        d / "test.yaml",
        "--engine",
        "sim",
        "--plain",
        "--executor",
        "slurm",
        "--job-time",
        "10",
        "--out",
        d / "slurm",
    ) in (0, 1)
    a, b = _json(d / "local" / "verdict.json"), _json(d / "slurm" / "verdict.json")
    assert a["verdict"] == b["verdict"] and a["rates"] == b["rates"]
    names = sorted(p.parent.name for p in (d / "local").glob("*/meta.json"))
    assert len(names) == 6
    for n in names:
        ma, mb = _meta(d / "local" / n), _meta(d / "slurm" / n)
        assert {t: v["sha256"] for t, v in ma["tables"].items()} == {t: v["sha256"] for t, v in mb["tables"].items()}, n
        assert mb["provenance"]["slurm"]["slurm_array_job_id"] and not ma["provenance"]["slurm"]["slurm_job_id"]
    rows = X.read_accounting_export(d / "slurm" / "provenance" / "accounting.json")
    assert len(rows) == 6 and all(r.state == "COMPLETED" for r in rows)

    common = [
        "calibrate",
        "stage-c",
        "--cell",
        "sglang-a100-300k",
        "--n",
        "16,24,48",
        "--warmup",
        "100",
        "--window",
        "200",
    ]
    assert _cli(*common, "--out", d / "c-local") == 0
    assert _cli(*common, "--executor", "slurm", "--job-time", "10", "--out", d / "c-slurm") == 0
    capsys.readouterr()
    assert _json(d / "c-local" / "stage-c.json")["result"] == _json(d / "c-slurm" / "stage-c.json")["result"]
    assert len(X.read_accounting_export(d / "c-slurm" / "provenance" / "accounting.json")) == 3


# ------------------------------------------------------------------------------- the vLLM job
@pytest.mark.timeout(900)
def test_vllm_job_launched_checked_and_completed(vllm_submission: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = _cli("jobs", "collect", vllm_submission, "--wait", "800")
    print(capsys.readouterr().out)
    col = _json(vllm_submission.parent / "collection.json")
    assert col["complete"] and not col["not_completed"], col["not_completed"]
    (j,) = _json(vllm_submission)["jobs"]
    run = load_run(vllm_submission.parent / j["run_dir"])
    m = run.meta
    assert run.status == "COMPLETED" and m["engine_backend"] == "vllm" and rc == 0
    assert (
        m["preflight"]["smoke"]["passed"]
        and m["preflight"]["canary"]["passed"]
        and m["preflight"]["canary"]["after"] == 0
    )
    assert m["engine_start"]["seconds"] > 0 and m["engine_launch"]["argv"][1:3] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    argv = m["engine_launch"]["argv"]  # submitted with no --engine-arg: the registered cell's launch extras
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(256 << 20) and "--enforce-eager" in argv
    ok = run.turns[run.turns["status"] == "ok"]
    assert len(ok) > 10 and (ok["n_output_ids"] == 16).all() and (ok["cached_tokens"] > 0).any()
    print(f"vLLM job: engine healthy {m['engine_start']['seconds']:.0f} s after launch; {len(ok)} turns")
