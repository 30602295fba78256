"""The job script's facts and checks before anything runs: the job as the scheduler describes it, the
time check and the code check (slurm/job.py runs them in its numbered order).

Why typed: each result travels from the check to the refusal message, to the job log and into the
run's meta.json (`job`, `time_check`, `code`), where collection, review and the benchmarks read it
back; a dataclass names every field once, and `to_json` writes exactly the keys meta.json has always
held (a key a check never reached stays absent, as before).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provenance.codepaths import CODE_DIRS, DATA_DIRS, is_code_path
from provenance.git import GitError, Repo
from slurm.budget import Budget
from slurm.scheduler import JobNotFound, SchedulerError, job_facts


class Refused(Exception):
    """A check failed: nothing may run. `check` names it (registration-missing, code, time, ...)."""

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check
        self.reason = reason


def utc_now() -> str:
    """UTC now with microseconds: a job's times are compared with the scheduler's and the runs'."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else float(x)


def _drop_none(d: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`d` without those of `keys` whose value is None (keys a check sets only when it gets there)."""
    return {k: v for k, v in d.items() if not (k in keys and v is None)}


# ---------------------------------------------------------------------------------------------
# scheduler facts
# ---------------------------------------------------------------------------------------------
@dataclass
class SchedulerFacts:
    """The job as SLURM describes it (ids None outside SLURM): from the job's environment, and its
    time left and limit from the controller (`squeue %L`/`%l`; seconds, None when unlimited or not
    set, with Slurm's own text). `error`: the controller could not be asked."""

    in_slurm: bool
    job_id: str | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    node: str | None = None
    partition: str | None = None
    cluster: str | None = None
    job_label: str | None = None  # ARRAY_TASK for an array task, else the job id
    time_limit_s: float | None = None
    time_limit: str | None = None
    time_left_s: float | None = None
    time_left: str | None = None
    error: str | None = None
    unlimited: bool | None = None  # set once the controller answered

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return _drop_none(d, ("unlimited",))


def scheduler_facts(env: Mapping[str, str] | None = None) -> SchedulerFacts:
    """The job's facts now ($SLURM_* from `env`, default the process environment; then squeue)."""
    env = os.environ if env is None else env
    jid = env.get("SLURM_JOB_ID")
    array_job = env.get("SLURM_ARRAY_JOB_ID")
    task = env.get("SLURM_ARRAY_TASK_ID", "")
    array_task = int(task) if task.isdigit() else None
    facts = SchedulerFacts(
        in_slurm=bool(jid),
        job_id=jid,
        array_job_id=array_job,
        array_task_id=array_task,
        node=env.get("SLURMD_NODENAME") or env.get("SLURM_JOB_NODELIST"),
        partition=env.get("SLURM_JOB_PARTITION"),
        cluster=env.get("SLURM_CLUSTER_NAME"),
        job_label=f"{array_job}_{array_task}" if array_job and array_task is not None else jid,
    )
    if not jid:
        return facts
    try:
        # An array task is asked for by ARRAY_TASK: the last task of an array runs under the
        # array's own id, for which squeue lists every task of the array.
        try:
            jf = job_facts(facts.job_label or jid)
        except JobNotFound:
            if facts.job_label == jid:
                raise
            jf = job_facts(jid)
        facts.time_limit_s = _finite(jf.time_limit_s)
        facts.time_limit = jf.time_limit
        facts.time_left_s = _finite(jf.time_left_s)
        facts.time_left = jf.time_left
        facts.partition = facts.partition or jf.partition
        facts.node = facts.node or jf.nodes
        facts.unlimited = jf.time_left_s is not None and math.isinf(jf.time_left_s)
    except SchedulerError as exc:
        facts.error = str(exc).splitlines()[0]
    return facts


# ---------------------------------------------------------------------------------------------
# the time check
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TimeCheck:
    """The pre-run time check's numbers: the budget, the warning lead, the time left and where it
    was read. `ok` False means refuse; `problem` says when the check could not be made at all."""

    budget: Budget
    warning_lead_s: float
    time_left_s: float | None
    time_left: str | None
    checked_at: str
    source: str
    ok: bool
    problem: str | None = None
    note: str | None = None

    @property
    def needed_s(self) -> float:
        return self.budget.needed_s

    @property
    def required_s(self) -> float:
        """What the job must have left: the run's need and the warning signal's lead."""
        return self.budget.needed_s + self.warning_lead_s

    def to_json(self) -> dict[str, Any]:
        d = {
            **self.budget.to_json(),
            "warning_lead_s": self.warning_lead_s,
            "required_s": self.required_s,
            "time_left_s": self.time_left_s,
            "time_left": self.time_left,
            "checked_at": self.checked_at,
            "source": self.source,
            "ok": self.ok,
            "problem": self.problem,
            "note": self.note,
        }
        return _drop_none(d, ("problem", "note"))


def time_check(facts: SchedulerFacts, budget: Budget, lead_s: float) -> TimeCheck:
    """The time left in the job against the run's budget plus the warning lead."""
    lead = float(lead_s)
    now = utc_now()

    def check(source: str, ok: bool, problem: str | None = None, note: str | None = None) -> TimeCheck:
        return TimeCheck(budget, lead, facts.time_left_s, facts.time_left, now, source, ok, problem, note)

    if not facts.in_slurm:
        return check("none: not in a SLURM job (no time limit to check)", True)
    source = "squeue -h -j $SLURM_JOB_ID -o %L"
    if facts.error:
        return check(source, False, problem=f"the time left could not be read: {facts.error}")
    if facts.unlimited:
        return check(source, True, note="the job has no time limit")
    left = facts.time_left_s
    if left is None:
        return check(source, False, problem=f"the scheduler reports no time limit yet ({facts.time_left!r})")
    return check(source, left >= budget.needed_s + lead)


# ---------------------------------------------------------------------------------------------
# the code check
# ---------------------------------------------------------------------------------------------
@dataclass
class CodeCheck:
    """Whether the code that runs is the registration's, and the facts that say so. `relation` is
    `same`, `descendant without code changes` or, in an exploratory job that would have been
    refused, `exploratory` with the `problem`."""

    checkout: str
    code_dirs: list[str] = field(default_factory=lambda: list(CODE_DIRS))
    data_dirs: list[str] = field(default_factory=lambda: list(DATA_DIRS))
    head: str | None = None
    registration_state: str | None = None
    registration_commit: str | None = None
    uncommitted: list[str] | None = None
    changed_paths: list[str] | None = None
    relation: str | None = None
    problem: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return _drop_none(d, tuple(self.__dataclass_fields__))


def code_check(code_root: Path, reg_path: Path, expected_commit: str | None, exploratory: bool) -> CodeCheck:
    """Is the code that runs the registration's? Returns the facts; raises Refused when it is not
    (in an exploratory job the facts are recorded and nothing is refused)."""
    facts = CodeCheck(checkout=str(code_root))

    def refuse(reason: str) -> CodeCheck:
        if exploratory:
            facts.relation, facts.problem = "exploratory", reason
            return facts
        raise Refused("code", reason)

    try:
        repo = Repo.containing(code_root)
        head = repo.head()
    except GitError as exc:
        return refuse(f"the code checkout {code_root} is not a git working tree ({exc})")
    facts.head = head
    try:
        rel = repo.relpath(reg_path)
    except ValueError:
        return refuse(
            f"the registration {reg_path} is not inside the code checkout {repo.path}; "
            "jobs run the code of the registration's repository"
        )
    state = repo.file_state(rel)
    facts.registration_state = state
    if state != "committed":
        what = "is not committed" if state == "untracked" else "differs from its last commit"
        return refuse(f"the registration {rel} {what} in the checkout {repo.path}")
    reg_commit = repo.last_commit_of(rel)
    if reg_commit is None:  # committed, yet no commit names it: a repository git cannot read
        return refuse(f"git names no commit of the registration {rel} in the checkout {repo.path}")
    facts.registration_commit = reg_commit
    if expected_commit and reg_commit != expected_commit:
        return refuse(
            f"the registration's commit in this checkout is {reg_commit}, but the submission resolved {expected_commit}"
        )
    dirty = [
        ln
        for ln in repo.git("diff", "--name-only", "HEAD", "--", *[d.rstrip("/") for d in CODE_DIRS]).splitlines()
        if is_code_path(ln)
    ]
    if dirty:
        facts.uncommitted = dirty[:20]
        return refuse(f"the checkout has uncommitted code changes: {dirty[:5]}")
    if head == reg_commit:
        facts.relation, facts.note = "same", f"runs the registration's commit {reg_commit[:12]}"
        return facts
    if not repo.is_ancestor(reg_commit, head):
        return refuse(
            f"the checkout's commit {head[:12]} does not descend from the registration's commit {reg_commit[:12]}"
        )
    changed = repo.changed_paths(reg_commit, head)
    code = [p for p in changed if is_code_path(p)]
    facts.changed_paths = changed[:50]
    if code:
        return refuse(
            f"the code differs from the registration's commit {reg_commit[:12]}: commit {head[:12]} changes {code[:5]}"
        )
    facts.relation = "descendant without code changes"
    facts.note = (
        f"runs commit {head[:12]}, a descendant of the registration's commit {reg_commit[:12]} that changes no code "
        f"({len(changed)} other path(s) changed)"
    )
    return facts
