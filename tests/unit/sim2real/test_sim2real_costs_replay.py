"""The cost fit recovers known costs from per-request timings; a replay plays a run's own plan and
a parity report compares the two runs; engine timings are parsed from vLLM's responses."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import yaml
from support.sim2real_cells import closed_cell, short_e2_bundle

from harness.config import CellConfig, WorkloadConfig, load_cost_file
from runs.closed_runs import run_closed
from sim2real import parity
from sim2real.costfit import CostFitError, fit_from_runs
from sim2real.replay import replay_run

TRUE = {"a": 4e-3, "f0": 0.0, "b": 3e-6, "c_p": 2e-10, "chunk": 8192, "c_d": 1e-3}


def _cell(**kw: object) -> CellConfig:
    return closed_cell(TRUE, max_running=64, prefix_cache=False, **kw)


WL = WorkloadConfig(
    name="w", first_prompt=512, tool_tokens=128, decode_tokens=8, turns={"mean": 8, "cap": 20}, tool_time={"mean": 0.2}
)


def test_fit_recovers_the_costs_that_made_the_timings(tmp_path: Path) -> None:
    # the simulator reports the same per-request timings a real vLLM does; its iterations cost TRUE
    dirs = []
    for n in (6, 24):
        run_closed(_cell(), WL, n, seed=1, warmup=2, window=12, run_dir=tmp_path / f"n{n}")
        dirs.append(tmp_path / f"n{n}")
    fit = fit_from_runs(dirs, 8192)
    for k in ("a", "b", "c_d"):
        assert fit.params[k] == pytest.approx(TRUE[k], rel=0.05), k
    assert fit.params["c_p"] == pytest.approx(TRUE["c_p"], rel=0.25)  # short prompts: pairs are a small term
    assert fit.residuals["all"]["median_abs_rel"] < 0.02
    doc = fit.cost_file("fitted", "vllm")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    cost = load_cost_file(tmp_path / "c.yaml")  # the `fit` record is carried, not a parameter
    assert cost.a == pytest.approx(fit.params["a"]) and cost.f0 == 0.0


def test_fit_refuses_runs_without_engine_timings(tmp_path: Path) -> None:
    import pandas as pd

    with pytest.raises(CostFitError, match="engine timings"):
        from sim2real.costfit import fit_costs

        fit_costs([pd.DataFrame({"status": ["ok"], "done_time": [1.0]})], 8192)


def test_replay_plays_the_runs_own_plan_and_parity_compares(tmp_path: Path) -> None:
    from runs.arms import execute_run

    b = short_e2_bundle()  # a short protocol: the replay must follow the run's meta.json, not the test file
    run = Path(execute_run(b, "burst", 1.35, 0, "sim", tmp_path / "run").run_dir)
    rep = replay_run(run, tmp_path / "replay")
    meta = json.loads((rep / "meta.json").read_text())
    assert (
        meta["replay_of"]["run_dir"] == str(run)
        and meta["plan"]["sha256"] == json.loads((run / "meta.json").read_text())["plan"]["sha256"]
    )
    r = parity.compare(run, rep, hit_bin=100.0, backlog_bin=10.0)
    # the same simulator with the same costs: the replay is the run
    assert r["turns"]["cached_equal"] == 1.0 and r["turns"]["matched"] == r["turns"]["real"]
    assert r["hit_fraction"]["within_band"] and r["backlog"]["within_band"]
    paths = parity.write([r], tmp_path / "report")
    assert "Replay parity" in paths["markdown"].read_text() and paths["figure"].stat().st_size > 1000
    # a replay with other costs differs, and says which cost file it used
    slow = tmp_path / "slow.yaml"
    slow.write_text(
        yaml.safe_dump(
            {
                "kind": "cost",
                "name": "slow",
                "engine": "sglang",
                "cells": ["sglang-a100-300k"],
                **{**TRUE, "a": 0.05, "chunk": 8192},
            }
        )
    )
    rep2 = replay_run(run, tmp_path / "replay2", cost_file=slow)
    r2 = parity.compare(run, rep2, hit_bin=100.0, backlog_bin=10.0)
    assert r2["cost_file"] == str(slow) and r2["latency_s"]["sim"]["p50"] > r["latency_s"]["sim"]["p50"]


def test_engine_timings_parsed_from_vllm_metrics() -> None:
    from harness.servers import get_adapter

    body = {
        "choices": [{"token_ids": [5, 6], "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}},
        "metrics": {
            "queue_time_ms": 2.0,
            "time_to_first_token_ms": 30.0,
            "generation_time_ms": 12.5,
            "mean_itl_ms": 12.5,
        },
    }
    t = get_adapter("vllm").parse_completion(200, orjson.dumps(body))
    assert t.extra["queue_time"] == pytest.approx(0.002) and t.extra["engine_ttft"] == pytest.approx(0.03)
    assert t.extra["engine_decode"] == pytest.approx(0.0125)
