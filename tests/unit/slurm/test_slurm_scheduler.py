"""Parsers and error handling of slurm.scheduler, against canned command output (no cluster)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from slurm import accounting_export as X
from slurm import parsers as P
from slurm import scheduler as S
from slurm.scheduler import CommandResult

# Captured from the local cluster (Slurm 22.05.8, SLURM_TIME_FORMAT=%s): a completed job with a comment
# holding the delimiter, an immediate failure, an array with a failing task.
SACCT_EPOCH = """\
2|wrap|1796110587|1796110588|1796110590|COMPLETED|0:0|vm|00:05:00|00:00:02|regsha=a|b c
3|wrap|1796110588|1796110588|1796110588|FAILED|3:0|vm|365-00:00:00|00:00:00|
4_0|wrap|1796110588|1796110588|1796110589|COMPLETED|0:0|vm|UNLIMITED|00:00:01|
4_2|wrap|1796110588|1796110590|1796110591|FAILED|1:0|vm|UNLIMITED|00:00:01|
9|sleep|1796110600|1796110601|1796110684|TIMEOUT|0:0|vm|00:01:00|00:01:23|
10|wrap|1796110700|Unknown|Unknown|PENDING|0:0|None assigned|00:05:00|00:00:00|
11|wrap|1796110700|1796110701|1796110702|CANCELLED by 0|0:15|vm|00:05:00|00:00:01|
"""


class FakeRunner:
    """Answers each command by its program name; records the calls."""

    def __init__(self, answers: Mapping[str, CommandResult | Exception]):
        self.answers = dict(answers)
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> CommandResult:
        self.calls.append((list(argv), dict(env)))
        answer = self.answers[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str) -> CommandResult:
    return CommandResult(0, stdout, "")


# ---------------------------------------------------------------------------------------- durations
@pytest.mark.parametrize(
    "text, seconds",
    [
        ("0:59", 59),
        ("5:00", 300),
        ("59:59", 3599),
        ("00:05:00", 300),
        ("1:00:00", 3600),
        ("23:59:59", 86399),
        ("1-00:00:00", 86400),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("365-00:00:00", 365 * 86400),
        ("1-12", 86400 + 12 * 3600),  # input form D-HH
        ("1-12:30", 86400 + 12 * 3600 + 30 * 60),  # input form D-HH:MM
        ("30", 1800),  # input form: minutes
        ("00:01.500", 1.5),  # sacct CPU times MM:SS.mmm
        (" 4:57 ", 297),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert P.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["UNLIMITED", "unlimited", "INFINITE", "-1"])
def test_parse_duration_unlimited(text: str) -> None:
    assert P.parse_duration(text) == math.inf


@pytest.mark.parametrize("text", ["NOT_SET", "Partition_Limit", "INVALID", "", "None", "Unknown"])
def test_parse_duration_no_value(text: str) -> None:
    assert P.parse_duration(text) is None


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "5-", "1.5", "-5:00"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        P.parse_duration(text)


def test_parse_time_left() -> None:
    assert P.parse_time_left("4:57") == 297
    assert P.parse_time_left("1-00:00:00") == 86400
    assert P.parse_time_left("UNLIMITED") == math.inf
    assert P.parse_time_left("INVALID") == 0.0  # past the limit, not yet killed
    assert P.parse_time_left("NOT_SET") is None


# --------------------------------------------------------------------------------------- timestamps
def test_parse_timestamp_epoch_is_utc() -> None:
    ts = P.parse_timestamp("1796110587")
    assert ts == datetime(2026, 12, 1, 7, 36, 27, tzinfo=UTC)
    assert ts is not None and ts.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("text", ["Unknown", "None", "", "0", "N/A"])
def test_parse_timestamp_unset(text: str) -> None:
    assert P.parse_timestamp(text) is None


def test_parse_timestamp_local_text_in_explicit_zone() -> None:
    ny = ZoneInfo("America/New_York")
    # Standard time (UTC-5) and summer time (UTC-4).
    assert P.parse_timestamp("2026-12-01T06:19:07", tz=ny) == datetime(2026, 12, 1, 11, 19, 7, tzinfo=UTC)
    assert P.parse_timestamp("2026-07-01T06:19:07", tz=ny) == datetime(2026, 7, 1, 10, 19, 7, tzinfo=UTC)
    # The repeated hour at the end of summer time: the first occurrence (still UTC-4).
    assert P.parse_timestamp("2026-11-01T01:30:00", tz=ny) == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    kolkata = ZoneInfo("Asia/Kolkata")
    assert P.parse_timestamp("2026-12-01T12:00:00", tz=kolkata) == datetime(2026, 12, 1, 6, 30, tzinfo=UTC)


def test_parse_timestamp_local_text_uses_tz_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    assert P.parse_timestamp("2026-12-01T12:00:00") == datetime(2026, 12, 1, 6, 30, tzinfo=UTC)
    assert P.local_timezone() == ZoneInfo("Asia/Kolkata")


def test_parse_timestamp_with_offset() -> None:
    assert P.parse_timestamp("2026-12-01T12:00:00+05:30") == datetime(2026, 12, 1, 6, 30, tzinfo=UTC)


def test_parse_timestamp_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        P.parse_timestamp("yesterday")


# --------------------------------------------------------------------------------- states and codes
def test_exit_codes_and_states() -> None:
    assert P.parse_exit_code("0:0") == (0, 0)
    assert P.parse_exit_code("3:0") == (3, 0)
    assert P.parse_exit_code("0:15") == (0, 15)
    assert P.parse_exit_code("") == (None, None)
    assert P.normalise_state("CANCELLED by 0") == "CANCELLED"
    assert P.normalise_state("running") == "RUNNING"
    assert P.normalise_state("COMPLETED+") == "COMPLETED"
    assert P.is_terminal("CANCELLED by 1000") and P.is_terminal("TIMEOUT")
    assert not P.is_terminal("PENDING") and not P.is_terminal("RUNNING") and not P.is_terminal("COMPLETING")


def test_states_are_normalised_to_the_enum_in_one_place() -> None:
    """squeue's and sacct's text, the local executor's words and an export read back all become a
    JobState through normalise_state; text no Slurm state names reads as UNKNOWN, never as itself."""
    assert P.normalise_state("CANCELLED by 0") is P.JobState.CANCELLED
    assert P.normalise_state("") is P.JobState.UNKNOWN
    assert P.normalise_state("NOT_A_STATE") is P.JobState.UNKNOWN
    assert P.parse_squeue_states("5_0|PENDING\n5_1|RUNNING+\n") == {
        "5_0": P.JobState.PENDING,
        "5_1": P.JobState.RUNNING,
    }
    assert {type(r.state) for r in P.parse_sacct(SACCT_EPOCH)} == {P.JobState}
    # the categories status reports by partition the states that are not final, and SPECIAL_EXIT
    # (requeued and held) is both pending and final, as before
    assert set() == P.PENDING_STATES & P.RUNNING_STATES
    assert {P.JobState.SPECIAL_EXIT} == P.PENDING_STATES & P.TERMINAL_STATES


# ------------------------------------------------------------------------------------------- sacct
def test_parse_sacct_rows() -> None:
    rows = P.parse_sacct(SACCT_EPOCH)
    by_id = {r.job_id: r for r in rows}
    assert list(by_id) == ["2", "3", "4_0", "4_2", "9", "10", "11"]
    ok_row = by_id["2"]
    assert ok_row.state == "COMPLETED" and ok_row.exit_code == 0 and ok_row.exit_signal == 0
    assert ok_row.comment == "regsha=a|b c"  # the delimiter inside the last field survives
    assert ok_row.submit == datetime(2026, 12, 1, 7, 36, 27, tzinfo=UTC)
    assert ok_row.end is not None and ok_row.start is not None
    assert (ok_row.end - ok_row.start).total_seconds() == ok_row.elapsed_s == 2
    assert ok_row.timelimit_s == 300 and ok_row.node_list == "vm"
    assert by_id["3"].state == "FAILED" and by_id["3"].exit_code == 3
    assert by_id["3"].timelimit_s == 365 * 86400
    assert by_id["4_2"].array_job_id == "4" and by_id["4_2"].array_task_id == 2 and by_id["4_2"].exit_code == 1
    assert by_id["4_0"].timelimit_s == math.inf and by_id["2"].array_job_id is None
    assert by_id["9"].state == "TIMEOUT" and by_id["9"].elapsed_s == 83
    pending = by_id["10"]
    assert pending.start is None and pending.end is None and pending.node_list == "" and not pending.terminal
    cancelled = by_id["11"]
    assert cancelled.state == "CANCELLED" and cancelled.state_raw == "CANCELLED by 0" and cancelled.exit_signal == 15


def test_parse_sacct_multiline_comment_and_empty() -> None:
    out = (
        "5|j|1796110587|1796110588|1796110590|COMPLETED|0:0|vm|00:05:00|00:00:02|line one\nline|two\n"
        "6|k|1796110587|Unknown|Unknown|PENDING|0:0|None assigned|UNLIMITED|00:00:00|\n"
    )
    rows = P.parse_sacct(out)
    assert [r.job_id for r in rows] == ["5", "6"]
    assert rows[0].comment == "line one\nline|two"
    assert P.parse_sacct("") == []
    with pytest.raises(ValueError):
        P.parse_sacct("garbage without fields\n")


def test_accounting_command_and_env() -> None:
    fake = FakeRunner({"sacct": ok(SACCT_EPOCH)})
    rows = S.accounting([2, "4"], runner=fake)
    assert len(rows) == 7
    argv, env = fake.calls[0]
    assert argv[:4] == ["sacct", "--parsable2", "--noheader", "-X"]
    assert argv[4] == "--format=JobID,JobName,Submit,Start,End,State,ExitCode,NodeList,Timelimit,Elapsed,Comment"
    assert "--jobs=2,4" in argv
    assert env["SLURM_TIME_FORMAT"] == "%s"


def test_accounting_by_comment_reads_all_users_and_filters() -> None:
    fake = FakeRunner({"sacct": ok(SACCT_EPOCH)})
    rows = S.accounting(comment="regsha=a|b c", runner=fake)
    assert [r.job_id for r in rows] == ["2"]
    argv, _ = fake.calls[0]
    assert "--allusers" in argv and any(a.startswith("--starttime=") for a in argv)
    assert not any(a.startswith("--jobs") for a in argv)


def test_accounting_empty_ids_and_bad_ids() -> None:
    fake = FakeRunner({})
    assert S.accounting([], runner=fake) == [] and fake.calls == []
    with pytest.raises(ValueError):
        S.accounting(["1; rm -rf /"], runner=fake)


def test_accounting_disabled() -> None:
    fake = FakeRunner({"sacct": CommandResult(1, "", "Slurm accounting storage is disabled\n")})
    with pytest.raises(S.AccountingDisabled, match="slurmdbd"):
        S.accounting([1], runner=fake)


def test_accounting_unreachable_and_other_errors() -> None:
    down = CommandResult(1, "", "sacct: error: Problem talking to the database: Connection refused\n")
    with pytest.raises(S.SchedulerUnavailable):
        S.accounting([1], runner=FakeRunner({"sacct": down}))
    odd = CommandResult(1, "", "sacct: error: something else\n")
    with pytest.raises(S.SchedulerError, match="something else") as info:
        S.accounting([1], runner=FakeRunner({"sacct": odd}))
    assert not isinstance(info.value, (S.SchedulerUnavailable, S.AccountingDisabled))
    assert info.value.returncode == 1


def test_missing_command() -> None:
    with pytest.raises(S.SchedulerUnavailable, match="not installed"):
        S.accounting([1], runner=FakeRunner({"sacct": FileNotFoundError("sacct")}))


# ------------------------------------------------------------------------------------------ squeue
def test_time_left_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    fake = FakeRunner({"squeue": ok("4:57\n")})
    assert S.time_left_s(runner=fake) == 297
    argv, _ = fake.calls[0]
    assert argv == ["squeue", "--noheader", "--jobs=42", "--format=%L"]


def test_time_left_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    assert S.time_left_s(7, runner=FakeRunner({"squeue": ok("UNLIMITED\n")})) == math.inf
    assert S.time_left_s(7, runner=FakeRunner({"squeue": ok("INVALID\n")})) == 0.0
    assert S.time_left_s(7, runner=FakeRunner({"squeue": ok("1-02:03:04\n")})) == 93784
    with pytest.raises(S.JobNotFound):
        S.time_left_s(7, runner=FakeRunner({"squeue": ok("")}))
    invalid = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
    with pytest.raises(S.JobNotFound):
        S.time_left_s(7, runner=FakeRunner({"squeue": invalid}))
    refused = CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")
    with pytest.raises(S.SchedulerUnavailable):
        S.time_left_s(7, runner=FakeRunner({"squeue": refused}))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(S.SchedulerError, match="SLURM_JOB_ID"):
        S.time_left_s(runner=FakeRunner({}))


def test_job_states_squeue_then_sacct() -> None:
    fake = FakeRunner({"squeue": ok("12|RUNNING\n4_0|COMPLETED\n4_1|PENDING\n"), "sacct": ok(SACCT_EPOCH)})
    states = S.job_states([12, 4, 9], runner=fake)
    assert states["12"] == "RUNNING" and states["4_0"] == "COMPLETED" and states["4_1"] == "PENDING"
    assert states["9"] == "TIMEOUT"  # forgotten by the controller, found in accounting
    squeue_argv, _ = fake.calls[0]
    assert "--states=all" in squeue_argv and "--array" in squeue_argv
    sacct_argv, _ = fake.calls[1]
    assert "--jobs=9" in sacct_argv  # only the ids squeue did not cover


def test_job_states_unknown_single_id_and_no_accounting() -> None:
    invalid = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
    disabled = CommandResult(1, "", "Slurm accounting storage is disabled\n")
    assert S.job_states([99], runner=FakeRunner({"squeue": invalid, "sacct": disabled})) == {}
    assert S.job_states([99], runner=FakeRunner({"squeue": invalid, "sacct": ok("")})) == {}
    assert S.job_states([], runner=FakeRunner({})) == {}


# ------------------------------------------------------------------------------------------ export
def test_export_json_and_csv_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = P.parse_sacct(SACCT_EPOCH)
    kolkata = ZoneInfo("Asia/Kolkata")
    j = X.write_accounting_export(rows, tmp_path / "acct.json", local_tz=kolkata)
    c = X.write_accounting_export(rows, tmp_path / "acct.csv", local_tz=kolkata)
    doc = json.loads(j.read_text())
    assert doc["local_tz"] == "Asia/Kolkata" and len(doc["rows"]) == len(rows)
    first = doc["rows"][0]
    assert first["submit_utc"] == "2026-12-01T07:36:27+00:00"
    assert first["submit_local"] == "2026-12-01T13:06:27+05:30"
    assert first["comment"] == "regsha=a|b c"
    unlimited = next(r for r in doc["rows"] if r["job_id"] == "4_0")
    assert unlimited["timelimit"] == "UNLIMITED" and unlimited["timelimit_s"] is None
    pending = next(r for r in doc["rows"] if r["job_id"] == "10")
    assert pending["start_utc"] is None and pending["start_local"] is None
    header = c.read_text().splitlines()[0].split(",")
    assert header[: len(X.EXPORT_COLUMNS)] == list(X.EXPORT_COLUMNS) and header[-1] == "local_tz"
    assert X.read_accounting_export(j) == rows
    assert X.read_accounting_export(c) == rows


def test_export_rejects_unknown_format(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="csv or json"):
        X.write_accounting_export([], tmp_path / "acct.txt")
    assert X.write_accounting_export([], tmp_path / "x.out", fmt="json").exists()


# ----------------------------------------------------------------------------- settled accounting
class SequenceRunner:
    """Answers successive calls with successive outputs (the last one repeats)."""

    def __init__(self, outputs: Sequence[str]):
        self.outputs = list(outputs)
        self.n = 0

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> CommandResult:
        out = self.outputs[min(self.n, len(self.outputs) - 1)]
        self.n += 1
        return ok(out)


def test_wait_for_accounting_waits_for_the_settled_row() -> None:
    # What slurmdbd showed for one job, poll by poll: pending, completed without its time limit,
    # then the final row.
    stages = [
        "19|wrap|1796111020|Unknown|Unknown|PENDING|0:0|None assigned||00:00:00|\n",
        "19|wrap|1796111020|1796111020|1796111020|COMPLETED|0:0|vm||00:00:00|hello x\n",
        "19|wrap|1796111020|1796111020|1796111020|COMPLETED|0:0|vm|00:02:00|00:00:00|hello x\n",
    ]
    runner = SequenceRunner(stages)
    (row,) = S.wait_for_accounting([19], poll_s=0.0, runner=runner)
    assert runner.n == 3 and row.settled and row.timelimit_s == 120 and row.comment == "hello x"
    assert not P.parse_sacct(stages[1])[0].settled
    with pytest.raises(TimeoutError, match="not final"):
        S.wait_for_accounting([19], timeout_s=0.0, poll_s=0.0, runner=SequenceRunner(stages[:2]))


def test_settled_without_a_start() -> None:
    (row,) = P.parse_sacct("30|wrap|1796111020|Unknown|1796111025|CANCELLED by 0|0:0|None assigned||00:00:00|\n")
    assert row.start is None and row.settled  # cancelled while pending: no start message will come


def test_wait_for_accounting_counts_array_tasks() -> None:
    one = "4_0|wrap|1796110588|1796110588|1796110589|COMPLETED|0:0|vm|UNLIMITED|00:00:01|\n"
    two = one + "4_1|wrap|1796110588|1796110589|1796110590|COMPLETED|0:0|vm|UNLIMITED|00:00:01|\n"
    runner = SequenceRunner([one, two])
    assert len(S.wait_for_accounting([4], count=2, poll_s=0.0, runner=runner)) == 2


def test_release_of_held_jobs_and_its_failure() -> None:
    """Jobs are submitted held (slurm/executors.py HOLD) and released by id; an array's id once."""
    fake = FakeRunner({"scontrol": ok("")})
    S.release(["32", "40"], runner=fake)
    assert fake.calls[0][0] == ["scontrol", "release", "32,40"]
    S.release([], runner=fake)  # nothing held: no command
    assert len(fake.calls) == 1
    with pytest.raises(ValueError, match="not a Slurm job id"):
        S.release(["32; rm"], runner=fake)
    down = FakeRunner({"scontrol": CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller")})
    with pytest.raises(S.SchedulerUnavailable, match="releasing held job"):
        S.release(["32"], runner=down)


def test_release_held_names_the_jobs_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm import executors

    seen: list[list[str]] = []

    def refuse(ids: list[str], **_: object) -> None:
        seen.append(list(ids))
        raise S.SchedulerError("scontrol release failed")

    monkeypatch.setattr(executors, "release", refuse)
    with pytest.raises(S.SchedulerError, match=r"scontrol release 32.*scancel 32"):
        executors.release_held(["32_0", "32_1", "32_2"])
    assert seen == [["32"]]  # the array once, not task by task
    assert executors.HOLD == {"hold": True}
