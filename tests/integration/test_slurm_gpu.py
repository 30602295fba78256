"""GPUs and time limits on the local SLURM cluster, end to end (slurm/local/cluster.sh gives its node
two GPUs that are no devices: Gres=gpu:2, gres.conf File= placeholder nodes of the null device).

* a registered test submitted with `--gres gpu:1` (on the emulator, which needs no device) is
  scheduled, completes, and its meta.json carries what the job was given (the scheduler's GPU
  variables, the job's gres, the node's GPU count);
* the same GPU cell submitted for its real engine without a gres is refused by the job, with the
  reason, before any engine starts;
* `calibrate stage-c --executor slurm` takes submit's job options (--gres, --account-free ones here:
  --job-env, --mem, --time, --python) into its sbatch script;
* TIMEOUT: a registered job whose engine starts slower than its registration allows (a launcher
  that sleeps 90 s before the emulator: a GPU engine loading its weights from a slow filesystem)
  outlives its 4-minute limit: the time-limit warning ends the run INTERRUPTED with its records, the
  job waits for the limit, accounting says TIMEOUT and `jobs collect` reports it with the reason.

Time: the TIMEOUT job takes about 5 minutes (a 4-minute limit, enforced up to ~30 s late, after a
90 s start). It is submitted by this module's first test and collected by a test marked `last`,
which runs after every other test of the session (tests/conftest.py), so the job runs beside the
other SLURM tests instead of holding the session up; this module's other tests take under a
minute.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.slurm_fixture import commit, fill, make_project

from cli.main import main
from harness.recording.record import load_run
from slurm import accounting_export as X
from slurm.gpus import gres_gpus

pytestmark = [pytest.mark.slurm, pytest.mark.wallclock, pytest.mark.usefixtures("slurm_cluster")]

# The job's timeline (a 4-minute limit, warning lead 60 s): the time check passes within ~10 s (it
# needs 120 s of run + 25 s of allowances + 60 s of lead); the engine is healthy ~100 s in and the
# drive starts; Slurm sends the warning "up to 60 s earlier" than 180 s (120-180 s), while the
# 120 s drive would end at ~225 s; the limit ends the job at 240-270 s.
SLOW_START_S = 90
LIMIT_MIN = 4
TIME_SCALE = 15  # the mini E2's 1800 plan seconds in 120 wall seconds


def _cli(*argv: Any) -> int:
    return main([str(a) for a in argv])


def _json(p: Path) -> Any:
    return json.loads(p.read_text())


def _meta(run: Path) -> dict[str, Any]:
    return orjson.loads((run / "meta.json").read_bytes())


# Session-scoped: the collecting test runs at the session's end (marked `last`), after other modules;
# a module-scoped fixture would be set up again there, and submit a second job.
@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpu")
    work, _remote = make_project(tmp)
    regs = {
        "one": fill(work, "gpu-mini", seeds="[3]", arms="[noburst]"),
        # small allowances: a 1800 s run at x15 (120 s) + 25 s fits a 4-minute limit, a slow engine start does not
        "slow": fill(
            work,
            "slow-mini",
            seeds="[3]",
            arms="[noburst]",
            allowances="{start_s: 10.0, smoke_s: 10.0, teardown_s: 5.0}",
        ),
    }
    commit(work, "register the GPU and time-limit tests", push=True)
    return {"tmp": tmp, "work": work, "regs": regs}


@pytest.fixture(scope="session")
def timeout_submission(project: dict[str, Any]) -> Path:
    """Submitted by this module's first test, collected by the session's last: the job runs while
    the others do."""
    out = project["tmp"] / "timeout"
    wrapper = f'sleep {SLOW_START_S}; exec "$@"'
    slow = shlex.join(["bash", "-c", wrapper, "slow-start", sys.executable, "-m", "harness.emulator"])
    assert (
        _cli(
            "submit",
            project["regs"]["slow"],
            "--engine",
            "emulator",
            "--time-scale",
            TIME_SCALE,
            "--time",
            LIMIT_MIN,
            "--server-cmd",
            slow,
            "--out",
            out,
        )
        == 0
    )
    doc = _json(out / "submission.json")
    assert (
        doc["time_limit"]["fits"]
        and doc["time_limit"]["minutes"] == LIMIT_MIN
        and doc["budget"]["needed_s"] == 1800 / TIME_SCALE + 25
    )
    return out / "submission.json"


@pytest.mark.timeout(300)
def test_a_gres_job_is_scheduled_and_records_its_gpus(project: dict[str, Any], timeout_submission: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = project["tmp"] / "with-gres"
    assert (
        _cli(
            "submit",
            project["regs"]["one"],
            "--engine",
            "emulator",
            "--time-scale",
            "60",
            "--gres",
            "gpu:1",
            "--out",
            out,
        )
        == 0
    )
    assert _cli("jobs", "collect", out / "submission.json", "--wait", "240", "--no-analysis") == 0
    capsys.readouterr()
    (j,) = _json(out / "submission.json")["jobs"]
    m = _meta(out / j["run_dir"])
    gpus = m["job"]["gpus"]
    print(f"\nthe job was given: {gpus}")
    assert m["status"] == "COMPLETED"
    assert gpus["given"] == 1 and gpus["node_gpus"] == 2 and gres_gpus(gpus["job_gres"]) == 1, gpus
    # the scheduler's variables name the index it gave (a placeholder node: no device behind it)
    assert gpus["env"].get("CUDA_VISIBLE_DEVICES") in ("0", "1") and gpus["visible_devices"] == [
        gpus["env"]["CUDA_VISIBLE_DEVICES"]
    ], gpus
    assert gpus["env"].get("SLURM_GPUS_ON_NODE") == "1" and (
        gpus["env"].get("SLURM_JOB_GPUS") or gpus["env"].get("SLURM_STEP_GPUS")
    ), gpus


@pytest.mark.timeout(300)
def test_a_gpu_cell_without_a_gres_is_refused_by_the_job(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = project["tmp"] / "no-gres"
    assert _cli("submit", project["regs"]["one"], "--engine", "sglang", "--out", out) == 0
    assert _cli("jobs", "collect", out / "submission.json", "--wait", "240", "--no-analysis") == 1
    capsys.readouterr()
    col = _json(out / "collection.json")
    (nc,) = col["not_completed"]
    assert (nc["state"], nc["exit_code"], nc["run_status"], nc["refused_by"]) == ("FAILED", 3, "REFUSED", "gpu"), nc
    assert "runs sglang on a GPU (A100 80GB PCIe)" in nc["reason"] and "--gres gpu:1" in nc["reason"], nc["reason"]
    m = _meta(out / "runs" / "noburst-r1.75-s3")
    assert m["job"]["gpus"]["given"] == 0 and m["job"]["gpus"]["node_gpus"] == 2 and "engine_launch" not in m


@pytest.mark.timeout(300)
def test_calibrate_through_slurm_takes_the_job_options(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = project["tmp"] / "calib"
    assert _cli("calibrate", "stage-c", "--cell", "sglang-a100-300k", "--n", "16", "--warmup", "100", "--window", "200",
                "--executor", "slurm", "--gres", "gpu:1", "--mem", "1G", "--time", "7", "--python", sys.executable,
                "--job-env", "AGENTLOAD_PROBE=gpu-test", "--out", out) == 0  # fmt: skip
    capsys.readouterr()
    (script,) = list((out / "slurm").glob("*/*_submission.sh"))
    text = script.read_text()
    for line in (
        "#SBATCH --gres=gpu:1",
        "#SBATCH --mem=1G",
        "#SBATCH --time=7",
        "export AGENTLOAD_PROBE=gpu-test",
        sys.executable,
    ):
        assert line in text, (line, text)
    (row,) = X.read_accounting_export(out / "provenance" / "accounting.json")
    assert row.state == "COMPLETED" and row.timelimit_s == 7 * 60


@pytest.mark.last
@pytest.mark.timeout(600)
def test_a_job_past_its_limit_is_interrupted_kept_and_collected_as_timeout(
    timeout_submission: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = _cli("jobs", "collect", timeout_submission, "--wait", "480", "--no-analysis")
    printed = capsys.readouterr().out
    print(printed)
    assert rc == 1
    col = _json(timeout_submission.parent / "collection.json")
    (nc,) = col["not_completed"]
    assert nc["state"] == "TIMEOUT" and nc["run_status"] == "INTERRUPTED", nc
    assert f"the scheduler's time limit (00:0{LIMIT_MIN}:00" in nc["reason"] and "time-limit warning" in nc["reason"], (
        nc["reason"]
    )
    assert "TIMEOUT" in printed and "time limit" in printed
    (row,) = X.read_accounting_export(timeout_submission.parent / "provenance" / "accounting.json")
    assert row.state == "TIMEOUT" and row.timelimit_s == LIMIT_MIN * 60 and col["agreement"] == []
    (j,) = _json(timeout_submission)["jobs"]
    run = load_run(timeout_submission.parent / j["run_dir"])
    assert run.status == "INTERRUPTED" and len(run.turns) > 0 and run.meta["tables"], run.meta.get("status_reason")
    job = run.meta["job"]
    assert run.meta["time_check"]["ok"]  # it had the time its registration asks for; the engine's start took longer
    assert any(s.get("meaning") for s in job["signals"]), job["signals"]  # the warning came first
    assert "SIGTERM" in job["limit_wait"]["outcome"], job["limit_wait"]  # then the limit itself
    assert run.meta["engine_start"]["seconds"] > SLOW_START_S
