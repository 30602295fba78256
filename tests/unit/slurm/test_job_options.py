"""One job option set for `submit`, `calibrate --executor slurm` and `test run --executor slurm`
(harness/protocols/job_options.py): the same flags parse to the same JobOptions everywhere, and reach
the sbatch parameters of both a submission and a sweep (slurm/executors.py, slurm/sweep.py)."""

from __future__ import annotations

import argparse

import pytest

from cli.main import build
from slurm.executors import job_parameters, sbatch_setup
from slurm.job_options import JobOptions, add_job_options, job_options_from_args
from slurm.sweep import DEFAULT_TASK_MIN, SlurmSweep

FLAGS = ["--gres", "gpu:1", "--account", "acct", "--qos", "high", "--mem", "64G", "--job-env", "HF_HOME=/scratch/hf",
         "--job-env", "A=b=c", "--python", "/opt/venv/bin/python", "--partition", "gpu", "--job-time", "1:30:00",
         "--parallel", "4", "--cpus-per-task", "8"]  # fmt: skip
WANT = JobOptions(
    partition="gpu",
    time="1:30:00",
    parallel=4,
    cpus_per_task=8,
    mem="64G",
    gres="gpu:1",
    account="acct",
    qos="high",
    python="/opt/venv/bin/python",
    job_env={"HF_HOME": "/scratch/hf", "A": "b=c"},
)


def _parse(argv: list[str]) -> argparse.Namespace:
    return build().parser.parse_args(argv)


@pytest.mark.parametrize("command", [
    ["submit", "reg.yaml"],
    ["calibrate", "e0a", "--cell", "sglang-a100-300k", "--executor", "slurm"],
    ["calibrate", "all", "--cell", "sglang-a100-300k", "--executor", "slurm", "--out", "o"],
    ["test", "run", "t.yaml", "--executor", "slurm"],
])  # fmt: skip
def test_every_command_takes_the_same_job_options(command: list[str]) -> None:
    assert job_options_from_args(_parse(command + FLAGS)) == WANT
    assert job_options_from_args(_parse(command)) == JobOptions()


def test_submit_keeps_its_time_flag_and_bad_values_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert job_options_from_args(_parse(["submit", "reg.yaml", "--time", "90"])).time == "90"
    for bad, why in (
        (["--job-env", "NOVALUE"], "expected NAME=VALUE"),
        (["--job-env", "1X=2"], "not a valid environment variable name"),
        (["--parallel", "0"], "expected at least 1"),
        (["--cpus-per-task", "two"], "expected a whole number"),
    ):
        with pytest.raises(SystemExit):
            _parse(["submit", "reg.yaml", *bad])
        assert why in capsys.readouterr().err, bad


def test_job_options_reach_the_sbatch_parameters(tmp_path) -> None:
    params = job_parameters(WANT)
    assert params == {
        "cpus_per_task": 8,
        "partition": "gpu",
        "mem": "64G",
        "gres": "gpu:1",
        "account": "acct",
        "qos": "high",
        "array_parallelism": 4,
    }
    assert "export HF_HOME=/scratch/hf" in sbatch_setup(tmp_path, WANT.job_env)
    sweep = SlurmSweep(tmp_path, job=WANT)
    assert sweep.time_min == 90 and sweep.job is WANT
    assert SlurmSweep(tmp_path).time_min == DEFAULT_TASK_MIN


def test_add_job_options_on_a_bare_parser() -> None:
    p = argparse.ArgumentParser()
    add_job_options(p, time_default="x")
    assert job_options_from_args(p.parse_args(["--time", "5"])) == JobOptions(time="5")
