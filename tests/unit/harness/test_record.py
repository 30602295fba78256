"""Run records: append-only while running, Parquet after close, one reader for both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from harness.recording.record import SCHEMAS, RunFormatError, RunRecorder, load_run

META = {"arm": "burst", "rate": 1.35, "seed": 0, "plan": {"sha256": "ab" * 32}}


def _fill(rec: RunRecorder, n: int = 50) -> None:
    for i in range(n):
        rec.session(session=i, kind="base", arrival=float(i), outcome="unfinished", stream=0, index=i, n_turns=3)
        rec.turn(
            session=i,
            kind="base",
            turn=1,
            send_time=float(i),
            done_time=i + 0.5,
            first_token_time=i + 0.2,
            prompt_tokens=2000,
            cached_tokens=0,
            completion_tokens=100,
            n_output_ids=100,
            request_id=i,
        )
    rec.turn(
        session=0, kind="base", turn=2, send_time=60.0, done_time=None, status="timeout", error="no reply in 600 s"
    )
    rec.session(
        session=0, kind="base", arrival=0.0, outcome="completed", end=61.0, stream=0, index=0, n_turns=3, turns_done=3
    )
    rec.gate_event(time=1.0, event="admit", session=3, queue_new=0, queue_resume=0, admitted=4, cap=20)
    rec.gauge(time=5.0, running=3, waiting=0, kv_used_tokens=12000, pool_tokens=300000)


def test_complete_run_roundtrip(tmp_path: Path) -> None:
    d = tmp_path / "run"
    with RunRecorder(d, META) as rec:
        _fill(rec)
    names = sorted(p.name for p in d.iterdir())
    assert names == ["gate_events.parquet", "gauges.parquet", "meta.json", "sessions.parquet", "turns.parquet"]
    run = load_run(d, verify=True)
    assert not run.partial and run.status == "COMPLETED" and run.meta["arm"] == "burst"
    assert run.meta["tables"]["turns"]["rows"] == 51 and len(run.turns) == 51
    assert len(run.sessions) == 50  # last row per session wins
    s0 = run.sessions.set_index("session").loc[0]
    assert s0["outcome"] == "completed" and s0["end"] == 61.0 and s0["turns_done"] == 3
    t = run.turns
    assert list(t.columns[: len(SCHEMAS["turns"])]) == SCHEMAS["turns"].names
    assert t["ttft"].iloc[1] == pytest.approx(0.2) and t["latency"].iloc[1] == pytest.approx(0.5)
    late = t[t.status == "timeout"].iloc[0]
    assert late["error"] == "no reply in 600 s" and late["prompt_tokens"] is pd_na()
    assert run.gauges["kv_evictable_tokens"].isna().all() and run.gauges["pool_tokens"].iloc[0] == 300000
    assert run.gate_events["cap"].iloc[0] == 20
    for name in ("turns", "sessions", "gate_events", "gauges"):
        assert len(run.meta["tables"][name]["sha256"]) == 64


def pd_na():
    import pandas as pd

    return pd.NA


def test_partial_run_reads_jsonl_with_the_same_dtypes(tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    with RunRecorder(full, META) as rec:
        _fill(rec)
    rec = RunRecorder(part, META)
    _fill(rec)
    rec.flush()
    with open(part / "turns.jsonl", "ab") as f:  # a kill in the middle of writing a row
        f.write(b'{"session": 7, "kind": "ba')
    run = load_run(part)
    assert run.partial and run.status == "RUNNING" and run.dropped_lines == 1
    ref = load_run(full)
    for name in ("turns", "sessions", "gate_events", "gauges"):
        a, b = getattr(run, name), getattr(ref, name)
        assert list(a.dtypes) == list(b.dtypes), name
        assert a.reset_index(drop=True).equals(b.reset_index(drop=True)), name


def test_killed_process_leaves_readable_rows(tmp_path: Path) -> None:
    d = tmp_path / "killed"
    child = f"""
import os, signal
from harness.recording.record import RunRecorder
rec = RunRecorder({str(d)!r}, {{"seed": 1}})
for i in range(2000):
    rec.turn(session=i, kind="base", turn=1, send_time=float(i), done_time=i + 1.0, prompt_tokens=2000)
os.kill(os.getpid(), signal.SIGKILL)
"""
    r = subprocess.run([sys.executable, "-c", child], capture_output=True)
    assert r.returncode != 0
    run = load_run(d)
    assert run.partial and run.status == "RUNNING"
    assert 1536 <= len(run.turns) <= 2000  # rows flushed every 512: at most the unflushed tail is lost
    assert list(run.turns["session"]) == list(range(len(run.turns)))


def test_status_changes_and_failures(tmp_path: Path) -> None:
    d = tmp_path / "r"
    rec = RunRecorder(d, META)
    rec.set_status("RUNNING")
    rec.update_meta({"engine": {"name": "sglang", "version": "0.5.22"}})
    assert orjson.loads((d / "meta.json").read_bytes())["engine"]["version"] == "0.5.22"
    with pytest.raises(ValueError, match="run status 'DONE'"):
        rec.set_status("DONE")
    with pytest.raises(ValueError, match="turn status 'fine'"):
        rec.turn(session=1, kind="base", turn=1, send_time=0.0, done_time=1.0, status="fine")
    with pytest.raises(ValueError, match="session outcome 'gone'"):
        rec.session(session=1, kind="base", arrival=0.0, outcome="gone")
    with pytest.raises(ValueError, match="set by the recorder"):
        rec.update_meta({"status": "COMPLETED"})
    rec.close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.gauge(time=1.0)
    with pytest.raises(FileExistsError):
        RunRecorder(d, META)
    with pytest.raises(ValueError, match="set by the recorder"):
        RunRecorder(tmp_path / "x", {"tables": 1})


def test_context_manager_marks_failed_and_interrupted(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), RunRecorder(tmp_path / "f", META) as rec:
        rec.gauge(time=0.0, running=1)
        1 / 0  # noqa: B018
    run = load_run(tmp_path / "f")
    assert run.status == "FAILED" and "ZeroDivisionError" in run.meta["status_reason"] and not run.partial
    assert len(run.gauges) == 1
    with pytest.raises(KeyboardInterrupt), RunRecorder(tmp_path / "i", META):
        raise KeyboardInterrupt
    assert load_run(tmp_path / "i").status == "INTERRUPTED"


def test_empty_run_and_verify_detects_changes(tmp_path: Path) -> None:
    d = tmp_path / "e"
    RunRecorder(d, META).close()
    run = load_run(d, verify=True)
    assert len(run.turns) == 0 and list(run.turns.columns)[:3] == ["session", "kind", "turn"]
    with open(d / "gauges.parquet", "ab") as f:
        f.write(b"x")
    with pytest.raises(RunFormatError, match="SHA-256 differs"):
        load_run(d, verify=True)
    with pytest.raises(RunFormatError, match=r"no meta\.json"):
        load_run(tmp_path / "nothing")


def test_damaged_middle_line_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "m"
    rec = RunRecorder(d, META)
    rec.flush()
    (d / "gauges.jsonl").write_bytes(b'{"time": 1.0}\n{"time": \n{"time": 2.0}\n')
    with pytest.raises(RunFormatError, match="damaged"):
        load_run(d)


def test_tables_left_out_come_back_empty_unread(tmp_path: Path) -> None:
    """load_run(tables=...): a compacted table left out is empty with its columns and dtypes and is not
    read (a damaged file does not matter); a table still in JSONL is read whatever `tables` says."""
    d = tmp_path / "r"
    with RunRecorder(d, META) as rec:
        _fill(rec)
    full = load_run(d)
    (d / "gauges.parquet").write_bytes(b"not parquet")  # never opened when left out
    run = load_run(d, tables=("turns", "sessions", "gate_events"))
    assert not run.partial and len(run.gauges) == 0
    assert list(run.gauges.dtypes) == list(full.gauges.dtypes) and list(run.gauges.columns) == SCHEMAS["gauges"].names
    for name in ("turns", "sessions", "gate_events"):
        assert getattr(run, name).equals(getattr(full, name)), name
    p = tmp_path / "m"
    rec = RunRecorder(p, META)
    rec.flush()
    (p / "gauges.jsonl").write_bytes(b'{"time": 1.0}\n{"time": \n{"time": 2.0}\n')
    with pytest.raises(RunFormatError, match="damaged"):  # in JSONL: read, and refused as before
        load_run(p, tables=("turns",))
