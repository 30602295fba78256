"""`jobs resubmit` (slurm/resubmit.py): only a job whose run never started is submitted again; its
run directory is kept aside, the manifest records both jobs, and `jobs collect` counts the newest.

The test directory is written here as a submission leaves it (a manifest, run directories with
meta.json), the scheduler's states are given and the submission is a stand-in that returns job
records, so no cluster is needed: tests/integration/test_slurm_submit.py covers the real submit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.recording.schema import meta_files_under
from prereg.outcomes import find_run_dirs
from slurm.collect import collect, format_collection
from slurm.manifest import FORMAT, FORMAT_VERSION, never_started, read_manifest
from slurm.parsers import JobState
from slurm.resubmit import ResubmitRefused, resubmit

TABLES = ("turns", "sessions", "gauges", "gate_events")


def _meta(status: str, rows: int = 0, sent: int = 0) -> dict[str, Any]:
    return {
        "status": status,
        "status_reason": "engine did not start (speed_pin): speed not settled in 8 probes" if rows == 0 else "",
        "drive": {"sent": sent},
        "tables": {t: {"file": f"{t}.parquet", "rows": rows, "sha256": "0" * 64} for t in TABLES},
    }


@pytest.mark.parametrize(
    ("meta", "ok"),
    [
        (_meta("FAILED"), True),
        (_meta("REFUSED"), True),
        (_meta("COMPLETED", rows=900, sent=900), False),
        (_meta("FAILED", rows=12, sent=12), False),  # failed mid-run: judged as it ended, never repeated
        (_meta("FAILED", rows=0, sent=3), False),  # turns sent, none recorded: still started
        (_meta("FAILED", rows=5, sent=0), False),  # records written, none counted as sent: still started
        ({**_meta("FAILED"), "tables": None}, False),  # cannot show that nothing was sent
        (None, False),
    ],
)
def test_only_a_run_that_sent_nothing_never_started(meta: dict[str, Any] | None, ok: bool) -> None:
    assert never_started(meta)[0] is ok


def _testdir(tmp_path: Path, metas: list[dict[str, Any]]) -> Path:
    jobs = []
    for i, meta in enumerate(metas):
        name = f"noburst-r1.25-s{i}"
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "meta.json").write_text(json.dumps(meta))
        spec = {"registration": "prereg/registrations/x.yaml", "sha256": "ab" * 32, "arm": "noburst", "rate": 1.25}
        spec |= {"seed": i, "run_dir": str(run), "engine": "sim", "index": i}
        jobs.append(
            {
                "index": i,
                "job_id": f"local-{i}",
                "arm": "noburst",
                "rate": 1.25,
                "seed": i,
                "plan_sha256": "cd" * 32,
                "run_dir": f"runs/{name}",
                "spec": spec,
                "state": "COMPLETED" if meta["status"] == "COMPLETED" else "FAILED",
                "submit_utc": "2026-12-06T03:14:34+00:00",
            }
        )
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "executor": "local",
        "registration": {"name": "x", "status": "FILLED", "committed": False, "clean": True},
        "checkout": {"path": str(tmp_path)},
        "jobs": jobs,
    }
    (tmp_path / "submission.json").write_text(json.dumps(doc))
    return tmp_path


def _fake_submit(calls: list[list[Any]]) -> Any:
    def submit(doc: dict[str, Any], specs: list[Any]) -> list[dict[str, Any]]:
        calls.append(list(specs))
        return [{"job_id": f"9{s.index}", "submit_utc": "2026-12-06T03:49:29+00:00", "state": "PENDING"} for s in specs]

    return submit


def test_a_job_that_never_started_is_resubmitted_and_both_stay_on_record(tmp_path: Path) -> None:
    td = _testdir(tmp_path, [_meta("COMPLETED", rows=900, sent=900), _meta("FAILED")])
    states = {"local-0": JobState.COMPLETED, "local-1": JobState.FAILED}
    calls: list[list[Any]] = []
    rec = resubmit(td, states=states, submit=_fake_submit(calls))
    (specs,) = calls
    assert [(s.arm, s.rate, s.seed, s.index) for s in specs] == [("noburst", 1.25, 1, 2)]
    assert specs[0].run_dir == str(td / "runs" / "noburst-r1.25-s1")  # the same run, written afresh
    kept = td / "superseded" / "noburst-r1.25-s1.job-local-1" / "meta.json"
    assert json.loads(kept.read_text())["status"] == "FAILED" and not (td / "runs" / "noburst-r1.25-s1").exists()
    doc = read_manifest(td)
    old, new = doc["jobs"][1], doc["jobs"][2]
    assert old["superseded_by"] == "92" and old["superseded_run_dir"] == "superseded/noburst-r1.25-s1.job-local-1"
    assert new["resubmission_of"] == "local-1" and new["run_dir"] == old["run_dir"] and new["seed"] == 1
    assert doc["resubmissions"] == [rec] and rec["new_jobs"] == ["92"]
    assert doc["jobs"][0] == json.loads((tmp_path / "submission.json").read_text())["jobs"][0]  # untouched

    # collect: the superseded job is listed as resubmitted, not as a job that did not complete
    (td / "runs" / "noburst-r1.25-s1").mkdir()
    (td / "runs" / "noburst-r1.25-s1" / "meta.json").write_text(json.dumps(_meta("COMPLETED", rows=900, sent=900)))
    m = json.loads((td / "submission.json").read_text())
    m["jobs"][2]["state"] = "COMPLETED"
    (td / "submission.json").write_text(json.dumps(m))
    res = collect(td)
    assert res["not_completed"] == [] and [t["job_id"] for t in res["resubmitted"]] == ["local-1"]
    assert res["resubmitted"][0]["run_status"] == "FAILED"  # read from where its run was kept
    assert "resubmitted local-1 noburst x 1.25 seed 1 as job 92" in format_collection(res)


def test_a_run_that_started_is_never_resubmitted(tmp_path: Path) -> None:
    td = _testdir(tmp_path, [_meta("COMPLETED", rows=900, sent=900), _meta("FAILED", rows=40, sent=40)])
    states = {"local-0": JobState.COMPLETED, "local-1": JobState.FAILED}
    calls: list[list[Any]] = []
    with pytest.raises(ResubmitRefused, match="nothing to resubmit") as info:
        resubmit(td, states=states, submit=_fake_submit(calls))
    assert "its run had started" in str(info.value)
    with pytest.raises(ResubmitRefused, match="resubmission refused: job local-0"):
        resubmit(td, indices=[0], states=states, submit=_fake_submit(calls))
    assert calls == [] and not (td / "superseded").exists()


def test_a_job_still_running_is_not_resubmitted_and_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    td = _testdir(tmp_path, [_meta("FAILED"), _meta("FAILED")])
    before = (td / "submission.json").read_bytes()
    states = {"local-0": JobState.RUNNING, "local-1": JobState.FAILED}
    calls: list[list[Any]] = []
    rec = resubmit(td, dry_run=True, states=states, submit=_fake_submit(calls))
    assert [j["job_id"] for j in rec["jobs"]] == ["local-1"] and calls == []
    assert (td / "submission.json").read_bytes() == before and (td / "runs" / "noburst-r1.25-s1").is_dir()
    with pytest.raises(ResubmitRefused, match="RUNNING: not finished"):
        resubmit(td, indices=[0], states=states, submit=_fake_submit(calls))


def test_a_superseded_run_is_never_found_as_a_run_of_the_test(tmp_path: Path) -> None:
    """Scoring and the registered analysis search a test directory for runs: the kept run of a
    resubmitted job must not count a second time for its arm x rate x seed."""
    for d in ("runs/noburst-r1.25-s2", "superseded/noburst-r1.25-s2.job-20_8"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "meta.json").write_text("{}")
    assert meta_files_under(tmp_path) == [tmp_path / "runs/noburst-r1.25-s2/meta.json"]
    assert find_run_dirs([tmp_path]) == [tmp_path / "runs/noburst-r1.25-s2"]
