"""Where a submission's jobs run: the SLURM scheduler through submitit, or local processes.

SLURM: every job of a submission has the same limit, so all of them go in one job array (in
submission order; the array index is the position), through submitit's `batch()`. The job script
is `slurm.job.JobEntry`, pickled by reference; the sbatch script exports PYTHONPATH to the code
checkout and starts in it, so the job imports the checkout's code, which is what its code check
compares with the registration's commit. `--signal=URG@lead` replaces submitit's USR2 warning: the
engine server gets every signal the job's processes get, and SIGURG (ignored by default) does not
kill it, while the job turns it into a graceful INTERRUPTED end (slurm/job.py).

Local: the same job entry (`python -m slurm.job --spec FILE`) as subprocesses of the submitting
command, at most `parallel` at a time, in submission order; ids are `local-N`, times are the local
clock's. For machines without a scheduler, and for the comparison a test makes between the cluster
and a local run of the same registration.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurm.job import WARNING_SIGNAL, JobEntry, JobSpec
from slurm.parsers import JobState


def _utc() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _local_state(returncode: int, stopping: bool) -> JobState:
    """A local job's state in the scheduler's words, from its process's exit (signals: CANCELLED)."""
    if returncode == 0:
        return JobState.COMPLETED
    return JobState.CANCELLED if returncode < 0 or stopping else JobState.FAILED


def sbatch_setup(checkout: Path, env: dict[str, str] | None = None) -> list[str]:
    """Lines of the sbatch script before the job starts: the checkout's code on the path."""
    lines = [f"export PYTHONPATH={shlex.quote(str(checkout))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    for k, v in sorted((env or {}).items()):
        if not k.isidentifier():
            raise ValueError(f"--job-env {k}={v}: {k!r} is not a valid environment variable name")
        lines.append(f"export {k}={shlex.quote(v)}")
    return lines


def slurm_executor(
    folder: Path,
    *,
    time_min: int,
    warning_lead_s: int,
    checkout: Path,
    comment: str,
    job_name: str,
    partition: str | None = None,
    cpus_per_task: int = 1,
    mem: str | None = None,
    gres: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    parallelism: int | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> Any:
    """A submitit SlurmExecutor with the submission's parameters."""
    import submitit

    ex = submitit.SlurmExecutor(folder=folder / "%j", python=python or sys.executable)
    params: dict[str, Any] = dict(
        time=int(time_min),
        cpus_per_task=int(cpus_per_task),
        job_name=job_name,
        comment=comment,
        setup=sbatch_setup(checkout, env),
        additional_parameters={"chdir": str(checkout), "signal": f"{WARNING_SIGNAL.name[3:]}@{int(warning_lead_s)}"},
    )
    for k, v in (("partition", partition), ("mem", mem), ("gres", gres), ("account", account), ("qos", qos)):
        if v:
            params[k] = v
    if parallelism:
        params["array_parallelism"] = int(parallelism)
    ex.update_parameters(**params)
    return ex


def submit_slurm(specs: Sequence[JobSpec], executor: Any) -> list[dict[str, Any]]:
    """Submit every spec as one array; one record per job, in order."""
    with executor.batch():
        jobs = [executor.submit(JobEntry(s.to_json())) for s in specs]
    after = _utc()
    out = []
    for spec, job in zip(specs, jobs):
        jid = str(job.job_id)
        arr, _, task = jid.partition("_")
        out.append(
            {
                "index": spec.index,
                "job_id": jid,
                "array_job_id": arr if task else None,
                "array_task_id": int(task) if task.isdigit() else None,
                "stdout": str(job.paths.stdout),
                "stderr": str(job.paths.stderr),
                "submitted_at_client": after,
            }
        )
    return out


def run_local(
    specs: Sequence[JobSpec],
    folder: Path,
    *,
    checkout: Path,
    python: str | None = None,
    env: dict[str, str] | None = None,
    parallel: int = 1,
    on_change: Callable[[list[dict[str, Any]]], None] | None = None,
    echo: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every spec as a local process (`python -m slurm.job --spec FILE`), `parallel` at a time.

    Returns one record per job (ids local-N, start/end on the local clock, exit code, state as a
    scheduler would name it). SIGINT/SIGTERM to this process are passed on to the running jobs,
    which end INTERRUPTED; jobs not yet started are recorded CANCELLED."""
    folder.mkdir(parents=True, exist_ok=True)
    run_env = {**os.environ, **(env or {})}
    run_env["PYTHONPATH"] = str(checkout) + (os.pathsep + run_env["PYTHONPATH"] if run_env.get("PYTHONPATH") else "")
    records: list[dict[str, Any]] = []
    for s in specs:
        i = s.index if s.index is not None else len(records)
        spec_file = folder / f"local-{i}.json"
        spec_file.write_text(json.dumps(s.to_json(), indent=2) + "\n")
        records.append(
            {
                "index": i,
                "job_id": f"local-{i}",
                "array_job_id": None,
                "array_task_id": None,
                "spec_file": str(spec_file),
                "stdout": str(folder / f"local-{i}.out"),
                "stderr": str(folder / f"local-{i}.err"),
                "state": JobState.PENDING.value,
                "submitted_at_client": None,
                "start_utc": None,
                "end_utc": None,
                "exit_code": None,
            }
        )
    running: dict[int, tuple[subprocess.Popen[bytes], Any, Any]] = {}
    stop = {"signal": None}

    def _forward(signum: int, _frame: Any) -> None:
        stop["signal"] = signum
        for proc, _, _ in running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    old = {}
    try:
        for s_ in (signal.SIGINT, signal.SIGTERM):
            old[s_] = signal.signal(s_, _forward)
    except ValueError:
        pass
    say = echo or (lambda m: None)
    try:
        todo = list(range(len(records)))
        while todo or running:
            while todo and len(running) < max(1, parallel) and stop["signal"] is None:
                k = todo.pop(0)
                rec = records[k]
                out, err = open(rec["stdout"], "wb"), open(rec["stderr"], "wb")
                rec["submitted_at_client"] = rec["start_utc"] = _utc()
                proc = subprocess.Popen(
                    [python or sys.executable, "-m", "slurm.job", "--spec", rec["spec_file"]],
                    cwd=checkout,
                    env=run_env,
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                )
                rec["state"], rec["pid"] = JobState.RUNNING.value, proc.pid
                running[k] = (proc, out, err)
                say(f"{rec['job_id']}: started ({specs[k].arm} x {specs[k].rate:g} seed {specs[k].seed})")
                if on_change:
                    on_change(records)
            if stop["signal"] is not None and todo:
                for k in todo:
                    records[k]["state"] = JobState.CANCELLED.value
                todo = []
            for k, (proc, out, err) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                out.close()
                err.close()
                rec = records[k]
                rec["end_utc"] = _utc()
                rec["exit_code"] = rc
                rec["state"] = _local_state(rc, stop["signal"] is not None).value
                del running[k]
                say(f"{rec['job_id']}: {rec['state']} (exit {rc})")
                if on_change:
                    on_change(records)
            if running:
                time.sleep(0.2)
    finally:
        for s_, h in old.items():
            signal.signal(s_, h)
    return records
