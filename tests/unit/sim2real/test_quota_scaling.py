"""Quota-scaled costs: runs made under different CPU quotas are fitted at their mean quota, and a
replay plays each run at the speed its own recorded quota gives (sim2real/quota.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.sim2real_cells import closed_cell, short_e2_bundle

from harness.config import WorkloadConfig, load_cost_file
from runs.arms import execute_run
from runs.closed_runs import run_closed
from sim2real.costfit import CostFitError, fit_from_runs
from sim2real.quota import quota_scales, replay_speed_factor, run_quota
from sim2real.replay import ForeignCostError, replay_run

TRUE = {"a": 4e-3, "f0": 0.0, "b": 3e-6, "c_p": 2e-10, "chunk": 8192, "c_d": 1e-3}
WL = WorkloadConfig(
    name="w", first_prompt=512, tool_tokens=128, decode_tokens=8, turns={"mean": 8, "cap": 20}, tool_time={"mean": 0.2}
)


def _set_meta(run: Path, **fields: object) -> None:
    meta = json.loads((run / "meta.json").read_text())
    meta.update(fields)
    (run / "meta.json").write_text(json.dumps(meta))


def _pin(quota: float) -> dict[str, object]:
    return {"applied": True, "pinned": True, "quota": quota, "ratio": 1.0}


def test_the_runs_quota_is_read_from_its_record() -> None:
    assert run_quota({"engine_speed_pin": _pin(0.71)}) == 0.71
    launch = {"argv": ["py", "-m", "harness.servers.cpuquota", "--cores", "0.5", "--name", "x", "--", "vllm"]}
    assert run_quota({"engine_launch": launch}) == 0.5  # a fixed quota, no pin
    assert run_quota({"engine_speed_pin": {"applied": False, "quota": 0.9}, "engine_launch": launch}) == 0.5
    assert run_quota({"engine_launch": {"argv": ["vllm", "serve"]}}) is None  # ran unquota'd
    assert run_quota({}) is None
    ref, factors = quota_scales([0.5, 0.7, 0.6], ["a", "b", "c"])
    assert ref == pytest.approx(0.6) and factors == pytest.approx([0.5 / 0.6, 0.7 / 0.6, 1.0])
    with pytest.raises(ValueError, match="no CPU quota recorded in b"):
        quota_scales([0.5, None], ["a", "b"])
    assert replay_speed_factor({"engine_speed_pin": _pin(0.7)}, None, "r") is None  # the cost is not scaled
    assert replay_speed_factor({"engine_speed_pin": _pin(0.7)}, 0.5, "r") == {
        "run_quota": 0.7,
        "cost_quota": 0.5,
        "factor": pytest.approx(1.4),
    }


def test_a_quota_scaled_fit_recovers_the_costs_of_runs_at_two_quotas(tmp_path: Path) -> None:
    # two engines with the same costs per CPU, one given 1.0 CPU and one 0.6: the second is 0.6x as fast
    dirs = []
    for quota in (1.0, 0.6):
        d = tmp_path / f"q{quota}"
        cell = closed_cell({**TRUE, "speed": quota}, max_running=64, prefix_cache=False)
        run_closed(cell, WL, 16, seed=1, warmup=2, window=12, run_dir=d)
        _set_meta(d, engine_speed_pin=_pin(quota))
        dirs.append(d)
    scaled = fit_from_runs(dirs, 8192, quota_scaled=True)
    plain = fit_from_runs(dirs, 8192)
    # the scaled fit holds at the mean quota, 0.8 CPU: every cost is TRUE's / 0.8, and fits both runs
    assert scaled.quota is not None and scaled.quota["cpu_quota"] == pytest.approx(0.8)
    for k in ("a", "b", "c_d"):
        assert scaled.params[k] == pytest.approx(TRUE[k] / 0.8, rel=0.05), k
    assert scaled.residuals["all"]["median_abs_rel"] < 0.02
    assert plain.residuals["all"]["median_abs_rel"] > 0.1  # one cost for both speeds misses both
    doc = scaled.cost_file("scaled", "vllm")
    assert doc["cpu_quota"] == pytest.approx(0.8) and set(doc["fit"]["quota_scaling"]["runs"]) == set(map(str, dirs))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    assert load_cost_file(tmp_path / "c.yaml").cpu_quota == pytest.approx(0.8)
    _set_meta(dirs[1], engine_speed_pin={})
    with pytest.raises(CostFitError, match=f"no CPU quota recorded in {dirs[1]}"):
        fit_from_runs(dirs, 8192, quota_scaled=True)


def test_a_replay_plays_each_run_at_its_own_quota(tmp_path: Path) -> None:
    bundle = short_e2_bundle({"min_window": 500.0, "recovered_span": 200.0})
    run = Path(execute_run(bundle, "noburst", 1.35, 0, "sim", tmp_path / "noburst").run_dir)
    _set_meta(run, engine_backend="sglang", engine_speed_pin=_pin(0.7))  # a real run at 0.7 CPU, as it reads
    cost = {"kind": "cost", "name": "q", "engine": "sglang", "cells": ["sglang-a100-300k"], **TRUE}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({**cost, "speed": 2.0, "cpu_quota": 0.5}))
    meta = json.loads((replay_run(run, tmp_path / "r", cost_file=tmp_path / "q.yaml") / "meta.json").read_text())
    assert meta["replay_of"]["quota_scaling"] == {"run_quota": 0.7, "cost_quota": 0.5, "factor": pytest.approx(1.4)}
    assert meta["cell"]["cost"]["speed"] == pytest.approx(2.8)  # the cost's own speed, times 0.7 / 0.5
    assert "cpu_quota" not in meta["cell"]["cost"]  # the factor is in the speed: the cell holds plain costs
    # a cost without cpu_quota is played as it is
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({**cost, "speed": 2.0}))
    meta = json.loads((replay_run(run, tmp_path / "p", cost_file=tmp_path / "plain.yaml") / "meta.json").read_text())
    assert "quota_scaling" not in meta["replay_of"] and meta["cell"]["cost"]["speed"] == 2.0
    # a quota-scaled cost for a run that records no quota: nothing says how fast its engine was
    _set_meta(run, engine_speed_pin={})
    with pytest.raises(ForeignCostError, match="records no quota"):
        replay_run(run, tmp_path / "r2", cost_file=tmp_path / "q.yaml")
    assert not (tmp_path / "r2").exists()


def test_a_replays_flip_margin_is_where_its_state_changes(tmp_path: Path) -> None:
    from analysis.rules import load_rule
    from sim2real.replay_margin import replay_margin
    from sim2real.states import run_state

    bundle = short_e2_bundle({"min_window": 500.0, "recovered_span": 200.0})
    run = Path(execute_run(bundle, "burst", 1.65, 0, "sim", tmp_path / "burst").run_dir)
    spec = load_rule(json.loads((run / "meta.json").read_text()).get("rule") or None)
    base = run_state(run, spec)["state"]
    m = replay_margin(run, None, spec, base_state=base, noise=None, max_change=0.9, tol=0.1, scratch=tmp_path)
    assert m["base"] == base and m["label"] == "unjudged" and m["noise"] is None
    bounded = [(d, x) for d, x in (("faster", m["faster"]), ("slower", m["slower"])) if x is not None]
    assert bounded, m  # this short burst recovers; on an engine 5x slower it does not
    d, x = bounded[0]
    factor = 1 + x if d == "faster" else 1 - x
    moved = replay_run(run, tmp_path / "moved", speed_factor=factor)
    assert json.loads((moved / "meta.json").read_text())["replay_of"]["speed_factor"] == factor
    # the speed moved the replay, and with the token reference moved alike the state differs there
    token_ref = json.loads((run / "meta.json").read_text())["references"]["all_miss_token_rate"]
    from analysis.paired import paired_run
    from analysis.staged_analysis import run_quantities

    v = paired_run(spec, run_quantities(moved, spec, refs_override={"all_miss_token_rate": token_ref * factor}).run)
    assert v["state"] != base, (m, v["state"])
    # labelled against a noise: a margin inside it is knife-edge, one beyond it robust (the noise is
    # probed exactly, so the label does not hang on the bisection's tolerance)
    others = [y for _, y in bounded[1:]]
    wide = replay_margin(run, None, spec, base_state=base, noise=x + 0.01, max_change=0.9, tol=0.1, scratch=tmp_path)
    assert wide["label"] == "knife-edge" and d in wide["inside_noise"], wide
    low = max(0.01, x - 0.11)
    if all(y > low for y in others):
        narrow = replay_margin(run, None, spec, base_state=base, noise=low, max_change=0.9, tol=0.1, scratch=tmp_path)
        assert narrow["label"] == "robust" and not narrow["inside_noise"], narrow


def test_the_command_refuses_a_quota_scaled_cost_for_a_run_without_a_quota_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    bundle = short_e2_bundle({"min_window": 500.0, "recovered_span": 200.0})
    with_q = Path(execute_run(bundle, "noburst", 1.35, 0, "sim", tmp_path / "a").run_dir)
    without = Path(execute_run(bundle, "burst", 1.35, 0, "sim", tmp_path / "b").run_dir)
    _set_meta(with_q, engine_backend="sglang", engine_speed_pin=_pin(0.6))
    _set_meta(without, engine_backend="sglang")
    cost = {"kind": "cost", "name": "q", "engine": "sglang", "cells": ["sglang-a100-300k"], **TRUE, "cpu_quota": 0.5}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(cost))
    argv = ["replay", str(with_q), str(without), "--cost", str(tmp_path / "q.yaml"), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "records no quota" in capsys.readouterr().err
    assert not (tmp_path / "out" / "replays").exists()  # nothing replayed, the first run neither


def test_replay_margins_through_the_command(tmp_path: Path) -> None:
    from cli.main import main

    bundle = short_e2_bundle({"min_window": 500.0, "recovered_span": 200.0})
    run = Path(execute_run(bundle, "burst", 1.65, 0, "sim", tmp_path / "runs" / "burst").run_dir)
    assert main(["replay", str(run), "--margins", "--out", str(tmp_path / "out")]) == 0
    (report,) = json.loads((tmp_path / "out" / "parity.json").read_text())
    m = report["margin"]
    # the short burst holds its state within the command's default +-50%: no side bounded, margin the cap
    assert m["base"] == report["states"]["sim"]["state"] == "RECOVERED"
    assert m["faster"] is None and m["slower"] is None and m["margin"] == m["max_change"] == 0.5
    assert m["label"] == "unjudged" and m["noise_from"] == "the run is bound to no registration"
    md = (tmp_path / "out" / "parity.md").read_text()
    assert "## Flip margins of the replayed states" in md and "Knife-edge: none (0 of 1 runs)." in md


def test_calibrate_costs_refuses_quota_scaling_without_runs_and_a_weight_without_summaries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    base = ["calibrate", "costs", "--cell", "vllm-cpu-tiny-65k", "--out", str(tmp_path / "c")]
    assert main([*base, "--quota-scaled", "--inputs", "prereg/inputs/vllm-cpu-tiny-65k"]) == 2
    assert "--quota-scaled scales the timings of recorded runs" in capsys.readouterr().err
    assert main([*base, "--reference-weight", "4", "--from-runs", str(tmp_path)]) == 2
    assert "give --inputs DIR" in capsys.readouterr().err
    assert main([*base, "--reference-weight", "0", "--inputs", "prereg/inputs/vllm-cpu-tiny-65k"]) == 2
    assert "expected a weight > 0" in capsys.readouterr().err
