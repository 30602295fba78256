"""What every scheduler job of a command asks for: one option set for `submit` and `--executor slurm`.

Why one set: a registered test (`agentload submit`) and a calibration or sweep through SLURM
(`calibrate ... --executor slurm`, `test run ... --executor slurm`) run on the same clusters, which
demand the same things of a job (a partition, an account, a QOS, a GPU gres, memory, the
interpreter of a venv, environment variables such as HF_HOME); a command that cannot say one of
them cannot run there. `add_job_options` adds the flags to a parser and `job_options_from_args`
reads them back into one typed `JobOptions`, which both the submission (slurm/submit.py) and the
sweep (slurm/sweep.py) hand to the executor (slurm/executors.py `job_parameters`).

Stdlib only: the command-line parsers build from it without importing the rest of slurm/.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobOptions:
    """sbatch's options of every job of one command (None: the cluster's or the command's default)."""

    partition: str | None = None
    time: str | None = None  # --time as sbatch reads it (minutes, HH:MM:SS, D-HH:MM); None: the command's default
    parallel: int | None = None  # jobs running at once (array parallelism; local executor: processes)
    cpus_per_task: int = 1
    mem: str | None = None
    gres: str | None = None  # e.g. gpu:1
    account: str | None = None
    qos: str | None = None
    python: str | None = None  # the interpreter the jobs run (default: the submitting one)
    job_env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def env_pair(text: str) -> tuple[str, str]:
    """`NAME=VALUE` for --job-env; NAME must be a shell variable name."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    if not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: {name!r} is not a valid environment variable name")
    return name, value


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected at least 1")
    return n


def add_job_options(p: argparse.ArgumentParser, *, time_default: str, title: str = "scheduler jobs") -> None:
    """The job options, in their own group of `p`'s help; `time_default` says what an absent --time means."""
    g = p.add_argument_group(title)
    g.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    g.add_argument(
        "--time",
        "--job-time",
        dest="time",
        metavar="LIMIT",
        help=f"time limit of each job as sbatch reads it (minutes, HH:MM:SS, D-HH:MM); default: {time_default}",
    )
    g.add_argument(
        "--parallel",
        type=positive_int,
        help="jobs running at once (SLURM array parallelism; local executor: processes)",
    )
    g.add_argument("--cpus-per-task", type=positive_int, default=1, help="CPUs per job (1)")
    g.add_argument("--mem", help="memory per job, as sbatch --mem (e.g. 64G)")
    g.add_argument(
        "--gres",
        help="generic resources per job, e.g. gpu:1 "
        "(a registered GPU cell's real-engine jobs refuse to run without one)",
    )
    g.add_argument("--account", help="SLURM account to charge")
    g.add_argument("--qos", help="SLURM quality of service")
    g.add_argument("--python", help="interpreter the jobs run (default: this one)")
    g.add_argument("--job-env", action="append", type=env_pair, default=[], metavar="NAME=VALUE",
                   help="environment variable for every job (repeatable), e.g. HF_HOME=/scratch/hf")  # fmt: skip


def job_options_from_args(args: argparse.Namespace) -> JobOptions:
    """The JobOptions of a parsed command line (add_job_options's flags)."""
    return JobOptions(
        partition=args.partition,
        time=args.time,
        parallel=args.parallel,
        cpus_per_task=int(args.cpus_per_task),
        mem=args.mem,
        gres=args.gres,
        account=args.account,
        qos=args.qos,
        python=args.python,
        job_env=dict(args.job_env or []),
    )
