"""Where a submission's jobs run: the SLURM scheduler through submitit, or local processes.

SLURM: every job of a submission has the same limit, so all of them go in one job array (in
submission order; the array index is the position), through submitit's `batch()`. The job script
is `slurm.job.JobEntry`, pickled by reference; the sbatch script exports PYTHONPATH to the code
checkout and starts in it, so the job imports the checkout's code, which is what its code check
compares with the registration's commit. `--signal=URG@lead` replaces submitit's USR2 warning: the
engine server gets every signal the job's processes get, and SIGURG (ignored by default) does not
kill it, while the job turns it into a graceful INTERRUPTED end (slurm/job.py). Jobs are submitted
held (`--hold`) and released once submitit has returned: submitit creates a job's log folder
(`<folder>/<job id>/`) only after sbatch has answered, and a task the scheduler starts at once
cannot open its stdout there and dies unrun ("No output/error stream produced"; seen on an idle
local cluster, where the first array task started 0.08 s after submission).

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
from slurm.job_options import JobOptions
from slurm.parsers import JobState
from slurm.scheduler import SchedulerError, release

#: sbatch's `--hold`: every job waits for `release_held` (why: the module's docstring).
HOLD: dict[str, Any] = {"hold": True}


def release_held(job_ids: Sequence[str]) -> None:
    """Release what was submitted with HOLD, once submitit has made the jobs' log folders: the
    array's id once for its tasks, a plain job's own id."""
    ids = list(dict.fromkeys(j.partition("_")[0] for j in job_ids))
    try:
        release(ids)
    except SchedulerError as exc:
        raise SchedulerError(
            f"job(s) {', '.join(ids)} were submitted held and could not be released; they wait until "
            f"`scontrol release {','.join(ids)}` (or `scancel {' '.join(ids)}` to drop them)\n{exc}"
        ) from exc


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


def job_parameters(job: JobOptions) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for what every job of a command asks for (the shared
    option set of `submit` and `--executor slurm`): partition, CPUs, memory, gres, account, QOS,
    array parallelism. The time limit and the script's setup lines are the caller's."""
    params: dict[str, Any] = {"cpus_per_task": int(job.cpus_per_task)}
    for k, v in (
        ("partition", job.partition),
        ("mem", job.mem),
        ("gres", job.gres),
        ("account", job.account),
        ("qos", job.qos),
    ):
        if v:
            params[k] = v
    if job.parallel:
        params["array_parallelism"] = int(job.parallel)
    return params


def sbatch_parameters(*, time_min: int, warning_lead_s: int, checkout: Path, comment: str, job_name: str,
                      job: JobOptions | None = None) -> dict[str, Any]:  # fmt: skip
    """submitit's SlurmExecutor parameters of a registered submission's jobs."""
    job = job or JobOptions()
    return dict(
        time=int(time_min),
        job_name=job_name,
        comment=comment,
        setup=sbatch_setup(checkout, job.job_env),
        additional_parameters={
            "chdir": str(checkout),
            "signal": f"{WARNING_SIGNAL.name[3:]}@{int(warning_lead_s)}",
            **HOLD,
        },
        **job_parameters(job),
    )


def slurm_executor(folder: Path, *, job: JobOptions | None = None, **params: Any) -> Any:
    """A submitit SlurmExecutor with the submission's parameters (sbatch_parameters' keywords)."""
    import submitit

    job = job or JobOptions()
    ex = submitit.SlurmExecutor(folder=folder / "%j", python=job.python or sys.executable)
    ex.update_parameters(**sbatch_parameters(job=job, **params))
    return ex


def sbatch_script(folder: Path, n_jobs: int, *, job: JobOptions | None = None, **params: Any) -> str:
    """The sbatch script `slurm_executor(folder, ...)` would submit for `n_jobs` jobs (one array when
    there are several, its task i running job i's pickled spec), without a scheduler or submitting
    anything: what `submit --dry-run` shows before a cluster's hours are spent. Written by submitit's
    own script writer and command line (submitit 1.5: SlurmExecutor._make_submission_file_text and
    _submitit_command_str), so it is the script a submission sends."""
    from submitit.slurm.slurm import _make_sbatch_string

    job = job or JobOptions()
    folder = (folder / "%j").expanduser().absolute()
    python = shlex.quote(sys.executable) if job.python is None else job.python  # as SlurmExecutor does
    command = " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])
    kw = sbatch_parameters(job=job, **params)
    if n_jobs > 1:
        kw["map_count"] = int(n_jobs)
    return str(_make_sbatch_string(command=command, folder=folder, **kw))


def submit_slurm(specs: Sequence[JobSpec], executor: Any) -> list[dict[str, Any]]:
    """Submit every spec as one array; one record per job, in order."""
    with executor.batch():
        jobs = [executor.submit(JobEntry(s.to_json())) for s in specs]
    release_held([str(j.job_id) for j in jobs])
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
    running: dict[int, subprocess.Popen[bytes]] = {}
    stop: dict[str, int | None] = {"signal": None}

    def _forward(signum: int, _frame: Any) -> None:
        stop["signal"] = signum
        for proc in running.values():
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
                # The job holds its own copies of the log descriptors: ours close once it has started.
                with open(rec["stdout"], "wb") as out, open(rec["stderr"], "wb") as err:
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
                running[k] = proc
                say(f"{rec['job_id']}: started ({specs[k].arm} x {specs[k].rate:g} seed {specs[k].seed})")
                if on_change:
                    on_change(records)
            if stop["signal"] is not None and todo:
                for k in todo:
                    records[k]["state"] = JobState.CANCELLED.value
                todo = []
            for k, proc in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
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
