"""The job script's exit statuses: how a registered job tells the scheduler what became of its run.

Why an enum of its own: the status is the only thing the scheduler's accounting keeps of a job's
outcome (sacct's ExitCode), so the job script (slurm/job.py), the submitit entry and collection
(slurm/collect.py, which turns an exit code back into a reason) must agree on every value. The run
statuses they stand for are the run record's (`RunStatus`).
"""

from __future__ import annotations

from enum import IntEnum

from harness.recording.schema import RunStatus


class JobExit(IntEnum):
    """A job's exit status by its run's status (0 completed, 3 refused, 4 failed, 5 interrupted)."""

    COMPLETED = 0
    REFUSED = 3
    FAILED = 4
    INTERRUPTED = 5

    @classmethod
    def of(cls, status: RunStatus) -> JobExit:
        """The exit status a run ending `status` gives its job (a run still RUNNING cannot end one)."""
        return cls[RunStatus(status).name]


#: What collection says of a job that exited with a status other than 0 (1: Python's own, when the
#: job raised before it could record anything).
EXIT_MEANING: dict[int, str] = {
    JobExit.REFUSED: "refused by the job's checks",
    JobExit.FAILED: "the run failed",
    JobExit.INTERRUPTED: "the run was interrupted",
    1: "the job raised (see its log)",
}
