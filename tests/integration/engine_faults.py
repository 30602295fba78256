"""Integration cases, the faults (engine_suite.py says what every case is for): a hung server, SIGTERM
to the client of an attached run, a server that dies mid-run. The last kills its server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from engine_runs import attached_burst_run, tiny_test_files
from engine_suite import check_follow_ups, run, sessions, tag, with_http
from live_engines import REPO, D, Live

from harness.config import WorkloadConfig
from harness.servers.smoke import canary, expected_cached


# ---------------------------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------------------------
def _wait_for_turns(
    path: Path, n: int, timeout: float, *, alive: Callable[[], bool] = lambda: True, follow_ups: bool = False
) -> int:
    """Wait until the run being written to `path` has n ok turns (follow-ups only, if asked)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            ok = sum(1 for r in rows if r.get("status") == "ok" and (not follow_ups or r.get("turn", 1) > 1))
            if ok >= n:
                return ok
        assert alive(), "the run ended before it recorded enough turns"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} ok turns in {path} after {timeout:.0f} s")


def _attached_run(
    live: Live, tmp_path: Path, workload: WorkloadConfig, plan: list[Any], **opts: Any
) -> tuple[Any, Any, Path]:
    from harness.client.openloop import PlanClient
    from harness.recording.record import RunRecorder, load_run
    from runs import realrun

    run_dir = tmp_path / "run"
    rec = RunRecorder(run_dir, {"test": "fault"})
    client = PlanClient(plan, workload, sink=rec)
    options = realrun.EngineOptions(
        engine=live.engine,
        base_url=live.url,
        served_model_name=live.model_name,
        cell_ref=str(live.cell_path),
        smoke=False,
        canary=False,
        **opts,
    )
    res = realrun.run_real(client, cell=live.cell, options=options, run_dir=run_dir, recorder=rec, gauge_interval=1.0)
    rec.close(res.status, res.reason)
    return res, load_run(run_dir), run_dir


FAULT_WORKLOAD = {
    "name": "tiny",
    "first_prompt": 128,
    "tool_tokens": 32,
    "decode_tokens": D,
    "turns": {"mean": 4.0, "cap": 6},
    "tool_time": {"mean": 0.3},
}


def case_hung_server_times_out(live: Live, tmp_path: Path) -> None:
    """The whole server stops answering (SIGSTOP to its process group) as the drive starts and
    for longer than the request timeout: every turn sent meanwhile is recorded as a timeout, the
    run completes flagged, and after SIGCONT the engine drops the abandoned requests and passes
    the canary again. (All sessions arrive after the stop, so the outcome does not depend on how
    fast the engine is on a loaded machine.)"""
    from harness.workload.draws import STREAM_BASE, draw_session

    workload = WorkloadConfig.model_validate(FAULT_WORKLOAD)
    plan = [draw_session(workload, 11, STREAM_BASE, i, 1.0 + 0.5 * i) for i in range(3)]
    timeout, stopped = 5.0, 9.0
    marks: dict[str, Any] = {}
    meta = tmp_path / "run" / "meta.json"

    def freeze() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the drive starts right after the preflight is recorded
            if meta.exists() and '"preflight"' in meta.read_text():
                break
            time.sleep(0.02)
        else:
            marks["error"] = "the run never reached its drive"
            return
        os.killpg(live.pgid, signal.SIGSTOP)
        marks["stop"] = time.monotonic()
        try:
            time.sleep(stopped)
        finally:
            os.killpg(live.pgid, signal.SIGCONT)
            marks["cont"] = time.monotonic()

    th = threading.Thread(target=freeze, daemon=True)
    th.start()
    try:
        res, data, _ = _attached_run(live, tmp_path, workload, plan, request_timeout=timeout)
    finally:
        th.join(timeout=stopped + 130)
        os.killpg(live.pgid, signal.SIGCONT)
    to = data.turns[data.turns["status"] == "timeout"]
    tag(live, f"hang: {res.status} {res.reason!r}; {len(to)} timeouts, {(data.turns['status'] == 'ok').sum()} ok turns")
    assert "stop" in marks, f"the server was never stopped: {marks.get('error')}"
    assert res.status == "COMPLETED" and res.flagged and res.timeouts == 3, res.reason
    assert (
        len(to) == 3
        and set(to["turn"]) == {1}
        and to["error"].str.contains(f"no complete response within {timeout:g} s").all()
    )
    assert ((to["done_time"] - to["send_time"]) >= 0.9 * timeout).all()
    assert len(data.turns) == 3  # a timeout ends its session (no retries): nothing else was sent

    async def after(http: aiohttp.ClientSession) -> Any:
        await live.adapter.flush_cache(http, live.url, timeout=120)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http)

    res2 = run(with_http(after))
    assert res2.passed and res2.after == 0, res2.reason


def case_sigterm_interrupts_an_attached_run(live: Live, tmp_path: Path) -> None:
    """`agentload run --engine ENGINE --base-url ...` passes the canary on the server and records
    follow-ups hitting whole pages; SIGTERM to the client then ends the run
    INTERRUPTED with its records kept, and leaves alone the server it did not launch: that one
    drops the abandoned requests and passes the canary again. (A server the run launched is
    stopped on the way out: tests/pipeline/test_faults.py with the emulator; the pool's stop checks the
    same for every real server.)"""
    from harness.recording.record import load_run

    test = tiny_test_files(live, tmp_path / "cfg", duration=900.0)
    out = tmp_path / "out"
    cmd = attached_burst_run(live, test, out, "--request-timeout", "120")
    t0 = time.monotonic()
    child = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _wait_for_turns(out / "turns.jsonl", 2, 600, alive=lambda: child.poll() is None, follow_ups=True)
        ready = time.monotonic() - t0
        os.kill(child.pid, signal.SIGTERM)
        t1 = time.monotonic()
        stdout, stderr = child.communicate(timeout=90)
        stop = time.monotonic() - t1
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
    meta = json.loads((out / "meta.json").read_text())
    tag(
        live,
        f"SIGTERM: {ready:.1f} s to 2 recorded follow-ups (canary included); exit {child.returncode} "
        f"{stop:.1f} s after the signal; {meta['status']}: {meta.get('status_reason')}",
    )
    assert child.returncode == 1 and "INTERRUPTED" in stdout, stdout[-2000:] + stderr[-2000:]
    assert meta["status"] == "INTERRUPTED" and "SIGTERM" in meta["status_reason"]
    assert "engine_launch" not in meta  # attached: nothing launched, nothing to stop
    pre = meta["preflight"]
    assert "smoke" not in pre and pre["canary"]["passed"] is True
    assert pre["canary"]["before"] == expected_cached(1024, live.block)  # 1023 or 992
    data = load_run(out)
    workload = WorkloadConfig.model_validate(
        {k: v for k, v in yaml.safe_load((tmp_path / "cfg" / "workload.yaml").read_text()).items() if k != "kind"}
    )
    assert check_follow_ups(data.turns, live.block, workload) >= 2
    assert live.alive()

    async def after(http: aiohttp.ClientSession) -> Any:
        await live.adapter.flush_cache(http, live.url, timeout=120)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http)

    res = run(with_http(after))
    assert res.passed and res.after == 0, res.reason


def case_dead_server_fails_the_run(live: Live, tmp_path: Path) -> None:
    """The server is killed (SIGKILL to its whole group) mid-run: the run ends FAILED with
    'server died', keeping every turn recorded before. (It kills the shared server: the pool
    starts a new one for any test that comes after.)"""
    workload = WorkloadConfig.model_validate(FAULT_WORKLOAD)
    plan = sessions(workload, 30, rate=1.0, seed=13)
    marks: dict[str, Any] = {}

    def kill() -> None:
        marks["ok_before"] = _wait_for_turns(tmp_path / "run" / "turns.jsonl", 2, 300)
        os.killpg(live.pgid, signal.SIGKILL)
        marks["killed"] = time.monotonic()

    th = threading.Thread(target=kill, daemon=True)
    th.start()
    t0 = time.monotonic()
    res, data, _ = _attached_run(live, tmp_path, workload, plan, request_timeout=120.0)
    th.join(timeout=310)
    tag(
        live,
        f"dead server: {res.status} {res.reason!r} {time.monotonic() - marks.get('killed', t0):.1f} s after the kill",
    )
    assert "killed" in marks
    assert res.status == "FAILED" and "server died" in res.reason, res.reason
    assert data.meta["status"] == "FAILED" and "server died" in data.meta["status_reason"]
    assert (data.turns["status"] == "ok").sum() >= marks["ok_before"]  # everything before the crash is kept
    assert not live.alive()
