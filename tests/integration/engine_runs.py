"""Integration cases, runs against a running server (engine_suite.py says what every case is for):
an open-loop run through the asyncio driver, the real-engine path attached to the server, the
`run` command, and a Stage C calibration.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from engine_suite import check_follow_ups, horizon, ids, run, sessions, tag, with_http
from live_engines import POOL, REPO, D, Live

from harness.config import WorkloadConfig
from harness.servers.smoke import canary, expected_cached

# ---------------------------------------------------------------------------------------------
# runs against the running server
# ---------------------------------------------------------------------------------------------
OPEN_LOOP = {
    "name": "tiny",
    "first_prompt": 256,
    "tool_tokens": 64,
    "decode_tokens": D,
    "turns": {"mean": 3.0, "cap": 5},
    "tool_time": {"mean": 0.5},
}


def case_open_loop_run(live: Live, tmp_path: Path) -> None:
    """12 sessions through the asyncio driver and the open-loop client: every follow-up reuses
    exactly the previous prompt and output, whole pages only; gauges are recorded; the flush
    then empties the cache."""
    from harness.client.openloop import PlanClient
    from harness.drivers.wall import drive
    from harness.recording.record import RunRecorder, load_run
    from harness.recording.schema import RunStatus

    workload = WorkloadConfig.model_validate(OPEN_LOOP)
    n = 12
    plan = sessions(workload, n, rate=2.0, seed=7)
    rec = RunRecorder(tmp_path / "run", {"test": "open-loop", "engine": live.engine})
    client = PlanClient(plan, workload, sink=rec)
    t0 = time.monotonic()
    result = run(
        drive(
            client,
            live.adapter,
            live.url,
            model_name=live.model_name,
            recorder=rec,
            gauge_interval=1.0,
            request_timeout=120.0,
            handle_signals=False,
        )
    )
    wall = time.monotonic() - t0
    rec.close()
    data = load_run(tmp_path / "run")
    assert result.status == RunStatus.COMPLETED, result.reason
    assert result.errors == 0 and result.timeouts == 0 and client.prompt_mismatches == 0

    turns = data.turns
    assert (turns["status"] == "ok").all()
    assert (data.sessions["outcome"] == "completed").all() and len(data.sessions) == n
    assert len(turns) == sum(s.n_turns for s in plan)
    assert (turns["n_output_ids"] == D).all()
    follow = check_follow_ups(turns, live.block, workload)
    assert follow == len(turns) - n > 0

    gauges = data.gauges
    tag(
        live,
        f"open loop: {len(turns)} turns ({follow} follow-ups) in {wall:.1f} s; {len(gauges)} gauge rows; "
        f"last {gauges.iloc[-1].to_dict() if len(gauges) else None}",
    )
    assert result.gauge_scrapes >= 2 and len(gauges) == result.gauge_scrapes
    assert (gauges["pool_tokens"] == POOL).all()
    assert gauges["running"].notna().all() and gauges["prompt_tokens_total"].is_monotonic_increasing
    assert gauges["cached_tokens_total"].iloc[-1] > 0

    async def after(http: aiohttp.ClientSession) -> tuple[Any, dict[str, float]]:
        await live.adapter.flush_cache(http, live.url, timeout=30)
        m = await live.adapter.scrape_metrics(http, live.url)
        return await canary(live.adapter, live.url, model_name=live.model_name, http=http), m

    res, m = run(with_http(after))
    assert res.passed and res.after == 0, res.reason
    if "kv_evictable_tokens" in m:
        # The run's idle KV is gone, not just the canary's: after the flush the cache holds only
        # what a probe leaves. SGLang reports its pool gauges on batches (and every 30 s when
        # idle), not per scrape, so the probe is also what makes the report fresh.
        probe = 100
        seen = run(with_http(lambda http: _evictable_after(live, http, ids(probe, seed=77))))
        assert seen[-1] == expected_cached(probe + 1, live.block), seen


async def _evictable_after(
    live: Live, http: aiohttp.ClientSession, prompt: np.ndarray, wait: float = 40.0
) -> list[float]:
    """kv_evictable_tokens as reported after one request, until it shows that request's KV."""
    await live.adapter.complete(http, live.url, prompt, 1, live.model_name)
    want = expected_cached(len(prompt) + 1, live.block)
    seen: list[float] = []
    deadline = time.monotonic() + wait
    while True:
        seen.append((await live.adapter.scrape_metrics(http, live.url))["kv_evictable_tokens"])
        if seen[-1] == want or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.5)


def case_run_real_attached(live: Live, tmp_path: Path) -> None:
    """The run command's real-engine path against the running server: smoke, canary, drive, meta."""
    from harness.client.openloop import PlanClient
    from harness.recording.record import RunRecorder, load_run
    from runs import realrun

    workload = WorkloadConfig.model_validate(
        {
            "name": "tiny",
            "first_prompt": 128,
            "tool_tokens": 32,
            "decode_tokens": D,
            "turns": {"mean": 2.0, "cap": 3},
            "tool_time": {"mean": 0.2},
        }
    )
    rec = RunRecorder(tmp_path / "run", {"test": "run_real"})
    client = PlanClient(sessions(workload, 4, rate=4.0, seed=3), workload, sink=rec)
    opts = realrun.EngineOptions(
        engine=live.engine, base_url=live.url, served_model_name=live.model_name, cell_ref=str(live.cell_path)
    )
    result = realrun.run_real(
        client, cell=live.cell, options=opts, run_dir=tmp_path / "run", recorder=rec, gauge_interval=1.0
    )
    rec.close()
    assert result.status == "COMPLETED", result.reason
    data = load_run(tmp_path / "run")
    pre = data.meta.get("preflight", {})
    assert pre.get("smoke", {}).get("passed") is True, pre
    assert pre.get("canary", {}).get("after") == 0 and pre["canary"]["before"] == expected_cached(1024, live.block), pre
    assert check_follow_ups(data.turns, live.block, workload) > 0


def tiny_test_files(live: Live, folder: Path, *, duration: float = 10.0) -> Path:
    """A one-arm test (the server's cell, a workload, a protocol, the BURST arm) for `agentload run`."""
    cell = yaml.safe_load(live.cell_path.read_text()) | {"lambda_ref": 1.0, "all_miss_token_rate": 1000.0}
    files = {
        "cell.yaml": cell,
        "workload.yaml": {
            "kind": "workload",
            "name": "tiny",
            "first_prompt": 128,
            "tool_tokens": 32,
            "decode_tokens": D,
            "turns": {"mean": 3.0, "cap": 4},
            "tool_time": {"mean": 0.3},
        },
        "protocol.yaml": {
            "kind": "protocol",
            "name": "tiny",
            "duration": duration,
            "burst": {"time": 3.0, "size": 3, "width": 1.0},
            "window": {"start": 5.0, "end": duration},
            "min_window": 2.0,
            "backlog_bin": 1.0,
            "recovered_span": 2.0,
            "gauge_interval": 1.0,
        },
        "burst.yaml": {"kind": "arm", "name": "burst", "burst": True},
        "test.yaml": {
            "kind": "test",
            "name": "tiny-cli",
            "cell": "cell.yaml",
            "workload": "workload.yaml",
            "protocol": "protocol.yaml",
            "arms": ["burst.yaml"],
            "rates": [1.0],
            "seeds": [0],
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "test.yaml"


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def attached_burst_run(live: Live, test: Path, out: Path, *extra: str) -> list[str]:
    """`agentload run` of the test's BURST arm at 1.0 x lambda_ref, seed 0, against the running
    server (no launch, no smoke: the canary before it and the smoke case cover those)."""
    return cli_argv(
        "run",
        "--config",
        str(test),
        "--arm",
        "burst",
        "--rate",
        "1.0",
        "--seed",
        "0",
        "--engine",
        live.engine,
        "--base-url",
        live.url,
        "--served-model-name",
        live.model_name,
        "--out",
        str(out),
        *extra,
        "--no-smoke",
    )


def case_cli_run_attached(live: Live, tmp_path: Path) -> None:
    """`agentload run --engine ... --base-url ...`: a BURST arm of a tiny test from config files to a
    COMPLETED run directory, through the runner, against the running server (the canary before
    it; the run command's smoke checks are the case above)."""
    from harness.recording.record import load_run

    test = tiny_test_files(live, tmp_path, duration=horizon(live, 12.0))
    out = tmp_path / "out"
    cmd = attached_burst_run(live, test, out)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = load_run(out)
    assert data.status == "COMPLETED" and not data.partial
    statuses = data.turns["status"].value_counts().to_dict()
    tag(live, f"agentload run: {statuses}")
    assert statuses.get("ok", 0) > 0 and set(statuses) <= {"ok", "unfinished"}, statuses
    assert len(data.gauges) >= 5
    assert data.meta["preflight"]["canary"]["after"] == 0 and "smoke" not in data.meta["preflight"]


def case_calibration_stage_c(live: Live, tmp_path: Path) -> None:
    """`agentload calibrate stage-c --engine ... --base-url ...`: a closed population of 4 over a
    short window on the running server, with the flush + canary before it; the window statistics
    are recomputed from the run's records and every follow-up hit as the cache predicts."""
    from analysis.calibration import window_stats
    from harness.recording.record import load_run
    from harness.workload.draws import expected_turns

    wl = {
        "kind": "workload",
        "name": "tiny-closed",
        "first_prompt": 128,
        "tool_tokens": 32,
        "decode_tokens": D,
        "turns": {"mean": 3.0, "cap": 4},
        "tool_time": {"mean": 0.3},
    }
    (tmp_path / "wl.yaml").write_text(yaml.safe_dump(wl))
    out = tmp_path / "cal"
    kind, _, flavor = live.engine.partition(":")
    engine = ["--engine", kind] + (["--flavor", flavor] if flavor else [])
    warmup, window = horizon(live, 3.0), horizon(live, 12.0)
    cmd = cli_argv(
        "calibrate",
        "stage-c",
        "--cell",
        str(live.cell_path),
        "--workload",
        str(tmp_path / "wl.yaml"),
        *engine,
        "--base-url",
        live.url,
        "--served-model-name",
        live.model_name,
        "--n",
        "4",
        "--warmup",
        f"{warmup:g}",
        "--window",
        f"{window:g}",
        "--no-smoke",
        "--out",
        str(out),
    )
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    tag(live, f"stage C ({time.monotonic() - t0:.1f} s):\n{proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "stage-c.json").read_text())
    (row,) = summary["result"]
    data = load_run(out / "stage-c-n4-s0")
    assert data.meta["status"] == "COMPLETED" and data.meta["population"] == 4
    assert data.meta["preflight"]["canary"]["after"] == 0
    workload = WorkloadConfig.model_validate(wl)
    again = window_stats(data.turns, data.sessions, warmup, warmup + window, expected_turns(workload), n=4, seed=0)
    assert row == json.loads(json.dumps(again.as_dict()))
    assert row["turns_completed"] > 0 and row["mu_turns"] > 0
    assert check_follow_ups(data.turns, live.block, workload) > 0
    assert row["token_hit_fraction"] > 0.3  # follow-ups reuse their whole previous turn
