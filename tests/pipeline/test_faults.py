"""Crash safety: every way a server or the client process fails ends in a recorded, labelled run.

The emulator runs as its own process, launched by the emulator adapter through runs.realrun
exactly as in a real run, with test-only fault injection (--fault). Small workload, time scale 100.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.client.openloop import PlanClient
from harness.config import CellConfig, WorkloadConfig, load_config
from harness.recording.record import RunRecorder, load_run
from harness.recording.schema import RunStatus
from harness.workload.draws import STREAM_BASE, draw_session
from runs.realrun import EngineOptions, run_real

pytestmark = [pytest.mark.timeout(60), pytest.mark.wallclock]  # wall-clock drives: one rerun if a try is late

SCALE = 100.0
WL = WorkloadConfig(name="tiny", first_prompt=256, tool_tokens=64, decode_tokens=8)


def cell_file(tmp_path: Path, flavor: str = "sglang") -> tuple[CellConfig, Path]:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    cell = base.model_copy(update={"name": f"tiny-{flavor}", "kv_pool_tokens": 60_000, "context_length": 8192})
    path = tmp_path / f"tiny-{flavor}.yaml"
    path.write_text(yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"})))
    return load_config(path, CellConfig), path


def plan(n: int = 8, gap: float = 2.0, turns: int = 6) -> list[Any]:
    out = []
    for i in range(n):
        s = draw_session(WL, 3, STREAM_BASE, i, arrival=i * gap)
        out.append(
            type(s)(
                **{
                    **s.__dict__,
                    "n_turns": turns,
                    "tool_times": tuple(min(z, 5.0) for z in (s.tool_times + (1.0,) * turns)[: turns - 1]),
                }
            )
        )
    return out


def options(cell_path: Path, *faults: str, **kw: Any) -> EngineOptions:
    extra: tuple[str, ...] = ()
    for f in faults:
        extra += ("--fault", f)
    base = {
        "engine": "emulator",
        "time_scale": SCALE,
        "server_cmd": (sys.executable, "-m", "harness.emulator"),
        "cell_ref": str(cell_path),
        "extra_args": (*extra, "--log-level", "WARNING"),
        "health_timeout": 30.0,
        "request_timeout": 30.0,
        "smoke": False,
        "canary": True,
    }
    base.update(kw)
    return EngineOptions(**base)  # type: ignore[arg-type]


def run_with(
    tmp_path: Path, opts: EngineOptions, cell: CellConfig, sessions: list[Any], duration: float | None = None
) -> tuple[Any, Any]:
    run_dir = tmp_path / "run"
    rec = RunRecorder(run_dir, {"test": "faults"})
    client = PlanClient(sessions, WL, sink=rec)
    res = run_real(
        client, cell=cell, options=opts, run_dir=run_dir, recorder=rec, duration=duration, gauge_interval=5.0
    )
    rec.close(res.status, res.reason)
    return res, load_run(run_dir)


# ---------------------------------------------------------------------------------------------
def test_engine_dies_mid_run(tmp_path: Path) -> None:
    cell, path = cell_file(tmp_path)
    # the canary sends 3 completions first; the server exits when the 15th request arrives
    res, data = run_with(tmp_path, options(path, "die-after:15"), cell, plan())
    assert res.status == "FAILED" and "server died" in res.reason
    assert data.meta["status"] == "FAILED" and "server died" in data.meta["status_reason"]
    ok = data.turns[data.turns["status"] == "ok"]
    assert len(ok) >= 10  # everything before the crash is kept
    assert data.meta["preflight"]["canary"]["passed"] is True


def test_server_dying_on_the_last_turn_of_an_attached_run_fails_it(tmp_path: Path) -> None:
    """A server that dies on the plan's last request leaves the client finished (its last session
    ended on that connection error) before the probe has answered: the run is still FAILED with
    'server died', not COMPLETED. Attached (no process to watch), as the real-engine tests drive
    their shared servers; found on a real SGLang killed while its last sessions ran."""
    from harness.servers import free_port, get_adapter

    cell, path = cell_file(tmp_path)
    sessions = plan(2, gap=0.5, turns=2)  # 4 requests; the server exits when the 4th arrives
    adapter = get_adapter(
        "emulator",
        cell=cell,
        cell_ref=str(path),
        time_scale=SCALE,
        server_cmd=[sys.executable, "-m", "harness.emulator"],
    )
    port = free_port()
    argv, env = adapter.launch_command(
        cell, model="tiny", host="127.0.0.1", port=port, extra_args=["--fault", "die-after:4", "--log-level", "WARNING"]
    )
    handle = adapter.start(argv, env, tmp_path / "server", host="127.0.0.1", port=port, health_timeout=30.0)
    try:
        opts = options(path, canary=False, base_url=handle.base_url)
        res, data = run_with(tmp_path, opts, cell, sessions)
    finally:
        adapter.stop(handle)
    assert res.status == "FAILED" and "server died" in res.reason, res.reason
    assert (data.turns["status"] == "ok").sum() == 3 and (data.turns["status"] == "error").sum() == 1


def test_bad_responses_are_per_turn_errors_and_flag_the_run(tmp_path: Path) -> None:
    cell, path = cell_file(tmp_path, "vllm")
    res, data = run_with(
        tmp_path, options(path, "5xx:6", "malformed:7", "no-usage:11", canary=False), cell, plan(10, turns=5)
    )
    assert res.status == "COMPLETED" and res.flagged
    assert data.meta["flagged"] is True and data.meta["drive"]["errors"] == res.errors
    t = data.turns
    errs = t[t["status"] == "error"]
    assert (errs["http_status"] == 500).any()
    reasons = " | ".join(errs["error"].astype(str))
    assert "malformed JSON" in reasons and "missing usage" in reasons
    assert (t["status"] == "ok").sum() > 0
    # an error ends its session (no retries): no turn after an error in the same session
    for sid, g in t.sort_values("turn").groupby("session"):
        bad = g[g["status"] != "ok"]
        if len(bad):
            assert g["turn"].max() == bad["turn"].min(), sid


def test_hung_request_times_out(tmp_path: Path) -> None:
    cell, path = cell_file(tmp_path)
    res, data = run_with(tmp_path, options(path, "hang:5", canary=False, request_timeout=1.0), cell, plan(6, turns=3))
    assert res.status == "COMPLETED" and res.timeouts >= 1 and res.flagged
    to = data.turns[data.turns["status"] == "timeout"]
    assert len(to) == res.timeouts and to["error"].str.contains("no complete response within 1 s").all()
    assert ((to["done_time"] - to["send_time"]) >= 0.9 * SCALE).all()  # 1 wall second = 100 plan seconds


def test_server_that_never_becomes_healthy_fails_the_run(tmp_path: Path) -> None:
    cell, path = cell_file(tmp_path)
    res, data = run_with(tmp_path, options(path, "unhealthy", health_timeout=3.0), cell, plan(2))
    assert res.status == "FAILED" and "never_healthy" in res.reason
    assert data.meta["status"] == "FAILED" and len(data.turns) == 0


_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_faults import WL, options, plan
    from harness.client.openloop import PlanClient
    from harness.config import CellConfig, load_config
    from runs.realrun import run_real
    from harness.recording.record import RunRecorder

    cell = load_config({cell!r}, CellConfig)
    run_dir = Path({run_dir!r})
    rec = RunRecorder(run_dir, {{"test": "sigterm"}})
    client = PlanClient(plan(40, gap=5.0, turns=6), WL, sink=rec)
    res = run_real(
        client, cell=cell, options=options(Path({cell!r}), canary=False), run_dir=run_dir, recorder=rec, duration=5000.0
    )
    rec.close(res.status, res.reason)
    print("STATUS", res.status, flush=True)
    """
)


def test_sigterm_to_the_client_interrupts_and_keeps_records(tmp_path: Path) -> None:
    _cell, path = cell_file(tmp_path)
    run_dir = tmp_path / "run"
    code = _CHILD.format(tests=str(Path(__file__).parent), cell=str(path), run_dir=str(run_dir))
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        turns = run_dir / "turns.jsonl"
        while not (turns.exists() and turns.stat().st_size > 0):  # wait for recorded turns
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "no turn recorded within 30 s"
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert "STATUS INTERRUPTED" in out
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "INTERRUPTED" and "SIGTERM" in meta["status_reason"]
    data = load_run(run_dir)
    assert (data.turns["status"] == "ok").sum() >= 1
    port = meta["engine_launch"]["port"]
    with pytest.raises(ConnectionRefusedError):  # the server was stopped on the way out
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# ---------------------------------------------------------------------------------------------
# realrun: a cache-off (E0a) preflight against a failing server is a FAILED run, not a crash
# ---------------------------------------------------------------------------------------------
def _small_cell(flavor: str = "sglang") -> CellConfig:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    return base.model_copy(update={"kv_pool_tokens": 60_000, "context_length": 8192})


def test_cache_off_preflight_error_is_a_failed_run(tmp_path: Path) -> None:

    cell = _small_cell("sglang").model_copy(update={"name": "tiny-off", "prefix_cache": False})
    path = tmp_path / "tiny-off.yaml"
    path.write_text(yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"})))
    cell = load_config(path, CellConfig)
    opts = EngineOptions(
        engine="emulator",
        time_scale=100.0,
        server_cmd=(sys.executable, "-m", "harness.emulator"),
        cell_ref=str(path),
        extra_args=("--fault", "5xx:1", "--log-level", "WARNING"),
        health_timeout=30.0,
        smoke=False,
    )
    run_dir = tmp_path / "run"
    rec = RunRecorder(run_dir, {"test": "cache-off"})
    wl = WorkloadConfig(name="tiny", first_prompt=256, tool_tokens=64, decode_tokens=8)
    res = run_real(PlanClient([], wl, sink=rec), cell=cell, options=opts, run_dir=run_dir, recorder=rec, duration=10.0)
    rec.close(res.status, res.reason)
    assert res.status == RunStatus.FAILED and "pre-run check failed" in res.reason and "cache-off check" in res.reason
    assert load_run(run_dir).meta["status"] == RunStatus.FAILED
