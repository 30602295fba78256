"""The local SLURM cluster with accounting, through submitit and slurm.scheduler.

What the provenance record needs from a scheduler is checked against a real one: submitit runs a
function and returns its result; sacct records COMPLETED / FAILED / TIMEOUT with the right exit codes,
the job's comment, and each array task on its own row; the timestamps convert to the right UTC
instants; a job reads a positive time left no larger than its limit.

Time: about 1.5 minutes, set by the one TIMEOUT job (`--time=1`; limits are whole minutes and are
enforced about every 30 s). It is submitted when the module starts and checked by the last test, so
the other tests run meanwhile (the node has two cores: one for it, one for the rest).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import cloudpickle
import pytest
import submitit

from slurm import accounting_export as X
from slurm import parsers as P
from slurm import scheduler as S
from slurm.local import ClusterStatus, ensure_up, status

pytestmark = [pytest.mark.slurm, pytest.mark.wallclock, pytest.mark.usefixtures("slurm_cluster")]

# The functions below run inside jobs. This module is imported by pytest under a name the job's
# interpreter cannot import, so they travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CLOCK_SLACK = timedelta(seconds=2)  # sacct's timestamps are whole seconds


def double(x: int) -> int:
    return 2 * x


def fail() -> None:
    raise ValueError("intended failure")


def time_left_in_job() -> tuple[float | None, str]:
    from slurm.scheduler import time_left_s

    return time_left_s(), os.environ["SLURM_JOB_ID"]


def sbatch(*args: str, cwd: Path) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={cwd}", f"--output={cwd}/%j.out", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return out.strip().split(";", 1)[0]


def wait_accounted(ids: Iterable[str], *, count: int | None = None, timeout_s: float = 60.0) -> list[P.AccountingRow]:
    return S.wait_for_accounting(ids, count=count, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm-jobs")


@pytest.fixture(scope="module", autouse=True)
def timeout_job(slurm_cluster: ClusterStatus, workdir: Path) -> Iterator[tuple[str, datetime]]:
    """A job that outlives its 1-minute limit, submitted first so it runs while the other tests do."""
    submitted = datetime.now(UTC)
    jid = sbatch("--time=1", "--job-name=agentload-timeout", "--wrap=sleep 300", cwd=workdir)
    yield jid, submitted
    subprocess.run(["scancel", jid], check=False, capture_output=True)


@pytest.fixture()
def executor(submitit_root: Path) -> submitit.SlurmExecutor:
    ex = submitit.SlurmExecutor(folder=submitit_root / "%j")
    ex.update_parameters(time=5)
    return ex


def test_cluster_is_up_and_ensure_up_is_a_no_op(slurm_cluster: ClusterStatus) -> None:
    assert slurm_cluster.up and slurm_cluster.partition == "debug"
    t0 = time.monotonic()
    again = ensure_up(echo=None)
    assert again.up and time.monotonic() - t0 < 10
    assert {d.name for d in status().daemons if d.running or d.external} == {
        "munged",
        "mariadbd",
        "slurmdbd",
        "slurmctld",
        "slurmd",
    }


@pytest.mark.timeout(120)
def test_submitit_runs_a_function_and_returns_its_result(executor: submitit.SlurmExecutor) -> None:
    comment = f"regsha={uuid.uuid4().hex}"
    executor.update_parameters(comment=comment)
    job = executor.submit(double, 21)
    assert job.result() == 42
    (row,) = wait_accounted([job.job_id])
    # done() answers from the result file alone; the state needs a forced sacct call.
    assert job.get_info(mode="force")["State"] == "COMPLETED" and job.state == "COMPLETED"
    assert (row.state, row.exit_code, row.comment, row.timelimit_s) == ("COMPLETED", 0, comment, 300)


@pytest.mark.timeout(120)
def test_submitit_failure_is_failed_with_exit_code_1(executor: submitit.SlurmExecutor) -> None:
    job = executor.submit(fail)
    with pytest.raises(submitit.core.utils.FailedJobError, match="intended failure"):
        job.result()
    (row,) = wait_accounted([job.job_id])
    assert (row.state, row.exit_code, row.exit_signal) == ("FAILED", 1, 0)
    assert job.get_info(mode="force")["State"] == "FAILED"


@pytest.mark.timeout(120)
def test_time_left_inside_a_job_is_positive_and_within_the_limit(executor: submitit.SlurmExecutor) -> None:
    left, jid = executor.submit(time_left_in_job).result()
    assert left is not None and 0 < left <= 5 * 60, left
    assert left > 5 * 60 - 60  # read in the job's first seconds
    # Outside any job (and after it ended) the controller is asked by id.
    with pytest.raises(S.JobNotFound):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the job leaves the queue's running set within seconds
            S.time_left_s(jid)
            time.sleep(0.5)


@pytest.mark.timeout(120)
def test_sacct_states_exit_codes_and_utc_times(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    ok = sbatch("--time=2", "--wrap=sleep 1", cwd=workdir)
    bad = sbatch("--wrap=exit 3", cwd=workdir)
    rows = {r.job_id: r for r in wait_accounted([ok, bad])}
    after = datetime.now(UTC)
    assert (rows[ok].state, rows[ok].exit_code, rows[ok].timelimit_s) == ("COMPLETED", 0, 120)
    assert (rows[bad].state, rows[bad].exit_code) == ("FAILED", 3)
    for row in rows.values():
        assert row.submit and row.start and row.end
        for ts in (row.submit, row.start, row.end):
            assert ts.tzinfo is not None and ts.utcoffset() == timedelta(0)
            assert before - CLOCK_SLACK <= ts <= after + CLOCK_SLACK, (row, before, after)
        assert row.submit <= row.start <= row.end
        assert row.elapsed_s == pytest.approx((row.end - row.start).total_seconds(), abs=1)
    ok_elapsed = rows[ok].elapsed_s
    assert ok_elapsed is not None and ok_elapsed >= 1

    # The same instants when sacct runs in another zone: the epoch format carries no zone.
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    assert {r.job_id: (r.submit, r.start, r.end) for r in S.accounting([ok, bad])} == {
        k: (r.submit, r.start, r.end) for k, r in rows.items()
    }
    # And Slurm's standard local-time text, read in that zone, converts to the same instants.
    env = {k: v for k, v in os.environ.items() if k != "SLURM_TIME_FORMAT"}
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", f"--jobs={ok}", "--format=Submit,Start,End"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert "T" in out and not out.split("|")[0].isdigit()
    kolkata = ZoneInfo("Asia/Kolkata")
    assert tuple(P.parse_timestamp(x, tz=kolkata) for x in out.split("|")) == (
        rows[ok].submit,
        rows[ok].start,
        rows[ok].end,
    )


@pytest.mark.timeout(120)
def test_job_states_from_squeue_then_sacct(workdir: Path) -> None:
    jid = sbatch("--wrap=sleep 2", cwd=workdir)
    states = S.job_states([jid])
    assert states[jid] in {"PENDING", "RUNNING", "CONFIGURING"}
    wait_accounted([jid])
    assert S.job_states([jid])[jid] == "COMPLETED"
    assert S.job_states(["999999"]) == {}


@pytest.mark.timeout(120)
def test_comment_round_trips_into_the_export(workdir: Path, tmp_path: Path) -> None:
    comment = f"regsha={uuid.uuid4().hex} plan=a|b"
    jid = sbatch(f"--comment={comment}", "--job-name=agentload-comment", "--wrap=true", cwd=workdir)
    wait_accounted([jid])
    rows = S.accounting(comment=comment)
    assert [r.job_id for r in rows] == [jid]
    kolkata = ZoneInfo("Asia/Kolkata")
    for suffix in ("json", "csv"):
        path = X.write_accounting_export(rows, tmp_path / f"accounting.{suffix}", local_tz=kolkata)
        assert X.read_accounting_export(path) == rows
    doc = json.loads((tmp_path / "accounting.json").read_text())
    rec = doc["rows"][0]
    assert rec["comment"] == comment and rec["job_name"] == "agentload-comment"
    assert datetime.fromisoformat(rec["end_local"]) == datetime.fromisoformat(rec["end_utc"])
    assert rec["end_local"].endswith("+05:30") and rec["end_utc"].endswith("+00:00")
    assert comment in (tmp_path / "accounting.csv").read_text()


@pytest.mark.timeout(120)
def test_array_tasks_appear_one_by_one(workdir: Path, executor: submitit.SlurmExecutor) -> None:
    array = sbatch("--array=0-3%2", "--wrap=sleep 1; exit $((SLURM_ARRAY_TASK_ID == 2))", cwd=workdir)
    seen = S.job_states([array])
    assert seen and all(k.startswith(array + "_") for k in seen), seen
    rows = {r.job_id: r for r in wait_accounted([array], count=4)}
    assert sorted(rows) == [f"{array}_{i}" for i in range(4)]
    for i in range(4):
        row = rows[f"{array}_{i}"]
        assert row.array_job_id == array and row.array_task_id == i
        expected = ("FAILED", 1) if i == 2 else ("COMPLETED", 0)
        assert (row.state, row.exit_code) == expected, row
    # The %2 throttle: never more than two tasks at once.
    for t in {r.start for r in rows.values()}:
        assert t is not None
        assert sum(1 for r in rows.values() if r.start and r.end and r.start <= t < r.end) <= 2
    # submitit's arrays map one task per input.
    jobs = executor.map_array(double, [1, 2, 3])
    assert [j.result() for j in jobs] == [2, 4, 6]
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1


@pytest.mark.timeout(180)
def test_timeout_is_recorded_as_timeout(timeout_job: tuple[str, datetime]) -> None:
    jid, submitted = timeout_job
    (row,) = wait_accounted([jid], timeout_s=170)
    assert (row.state, row.exit_code) == ("TIMEOUT", 0)
    assert row.timelimit_s == 60
    assert row.elapsed_s is not None and 60 <= row.elapsed_s < 150
    assert row.submit is not None and abs(row.submit - submitted) <= CLOCK_SLACK
    assert not math.isinf(row.timelimit_s)
