"""A staged family end to end on a stub engine and a tiny protocol: plans, runs, frozen
predictions, the verdict of `test run`, and the same verdict again from `analyze`."""

from __future__ import annotations

import heapq
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.judge import report_runs
from analysis.rules import load_rule
from cli.run import freeze_test_predictions
from harness.client.contract import Send, Timer, TurnResponse
from harness.config import load_test
from runs.backend import BackendResult, RunContext, register_backend
from runs.suite import run_test


def _stub(ctx: RunContext) -> BackendResult:
    """Requests answered 2 s after sending; a follow-up hits unless more than 30 requests are in
    flight (a crude trap: enough load and every turn misses)."""
    client, heap, seq, prev = ctx.client, [], itertools.count(), {}
    inflight = [0]

    def push(now: float, cmds: Any) -> None:
        for c in cmds:
            if isinstance(c, Timer):
                heapq.heappush(heap, (c.at, next(seq), "t", c.key))
            else:
                inflight[0] += 1
                heapq.heappush(heap, (now + 2.0, next(seq), "r", (now, c, inflight[0] > 30)))

    push(0.0, client.start(0.0))
    while heap and heap[0][0] < ctx.duration:
        now, _, kind, x = heapq.heappop(heap)
        if kind == "t":
            push(now, client.on_timer(now, x))
            continue
        sent, c, miss = x
        inflight[0] -= 1
        assert isinstance(c, Send)
        n = len(c.prompt)
        cached = 0 if miss else prev.get(c.session, 0)
        r = TurnResponse(
            c.request_id, "ok", sent, now, now - 1.0, np.zeros(c.max_tokens, np.int32), n, cached, c.max_tokens, 200
        )
        prev[c.session] = n + c.max_tokens
        push(now, client.on_response(now, r))
    return BackendResult("COMPLETED", None, ctx.duration, {"engine": {"backend": "stub-families"}})


register_backend("stub-families", _stub)


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "protocols").mkdir()
    (tmp_path / "protocols" / "tiny.yaml").write_text(
        "kind: protocol\nname: tiny\nduration: 1500.0\nburst: {time: 200.0, size: 60, width: 20.0}\n"
        "window: {start: 800.0, end: 1500.0}\nmin_window: 600.0\n"
    )
    (tmp_path / "arms").mkdir()
    (tmp_path / "arms" / "slow.yaml").write_text(
        "kind: arm\nname: toolslow-w\nburst: false\ntoolslow: {start: 200.0, end: 400.0, delta: 30.0}\n"
    )
    (tmp_path / "arms" / "rescue.yaml").write_text(
        "kind: arm\nname: rescue-r1\nburst: true\ngate: {kind: rescue, cap: 5, t_on: 400.0}\n"
    )
    return tmp_path


def _write_test(tmp: Path, name: str, body: str) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(
        f"kind: test\nname: {name}\ncell: sglang-a100-300k\nworkload: standard\nprotocol: protocols/tiny.yaml\n{body}"
    )
    return p


def _strip(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _strip(x) for k, x in v.items() if k not in ("wall_s",)}
    if isinstance(v, list):
        return [_strip(x) for x in v]
    return v


def test_toolslow_w_freezes_predictions_and_analyze_agrees(tiny: Path, tmp_path: Path) -> None:
    test = _write_test(
        tiny,
        "tiny-w",
        "rule: toolslow-3way\npredictions: freeze\narms: [arms/slow.yaml, noburst]\nrates: [1.35]\nseeds: [0, 1]\n",
    )
    bundle = load_test(test)
    out = tmp_path / "out"
    pred = freeze_test_predictions(bundle, load_rule("toolslow-3way"), out)
    frozen = json.loads(pred.read_text())
    assert [e["arm"] for e in frozen["runs"]] == ["toolslow-w", "toolslow-w"] and frozen["rates"][0]["values"]["z"] > 1
    results = run_test(test, "stub-families", out, jobs=1)
    assert all(r.status == "COMPLETED" for r in results)
    dirs = [r.run_dir for r in results]
    assert report_runs(dirs, out, test_path=str(test), rule=None, refs=None, predictions=str(pred)) == 0
    v1 = json.loads((out / "verdict.json").read_text())
    slow = [r for r in v1["runs"] if r["arm"] == "toolslow-w"]
    assert all(r["quantities"]["pred.z"] > 1 and "pred.fluid_slope" in r["quantities"] for r in slow)
    assert all(r["quantities"]["trigger.n"] > 0 for r in slow)  # sessions with a slowed call, from the client's events
    assert v1["predictions"]["sha256"] and v1["verdict"] in ("TRAPS", "NO-TRAP", "MIXED")
    # `agentload analyze` from the run directories: the test's 'freeze' finds the same file beside the runs
    assert report_runs(dirs, out / "analysis", test_path=str(test), rule=None, refs=None) == 0
    v2 = json.loads((out / "analysis" / "verdict.json").read_text())
    assert _strip(v1) == _strip(v2)
    assert (out / "report.md").read_text().count("| toolslow-w |") >= 2 and (out / "figure.png").stat().st_size > 5000


def test_rescue_with_registered_overrides(tiny: Path, tmp_path: Path) -> None:
    test = _write_test(
        tiny,
        "tiny-rescue",
        "rule: rescue-r1\nrule_params: {t_on: 400.0, release_deadline: 1400.0}\n"
        "arms: [arms/rescue.yaml, burst]\nrates: [1.65]\nseeds: [0]\n",
    )
    out = tmp_path / "r"
    results = run_test(test, "stub-families", out, jobs=1)
    dirs = [r.run_dir for r in results]
    report_runs(dirs, out, test_path=str(test), rule=None, refs=None)
    v = json.loads((out / "verdict.json").read_text())
    assert v["rule_spec"]["params"]["t_on"] == 400.0
    res = next(r for r in v["runs"] if r["arm"] == "rescue-r1")
    q = res["quantities"]
    assert (
        q["gate.engage"] == 400.0 and q["outstanding_on"] >= 0 and res["labels"]["rescue"] in ("RESCUED", "NOT-RESCUED")
    )
    assert "valid" in res["conditions"] and all("lhs" in c for c in res["conditions"]["valid"]["VALID"])
    assert v["groups"][0]["seeds"]["0"]["roles"]["rescue"]["arm"] == "rescue-r1"
    md = (out / "report.md").read_text()
    assert "outstanding at t_on" in md and "test:" in md


def test_missing_run_leaves_the_group_incomplete(tiny: Path, tmp_path: Path) -> None:
    test = _write_test(
        tiny, "tiny-basin", "rule: basin-2\narms: [basin-n40, basin-n60]\nrates: [1.65]\nseeds: [0, 1, 2]\n"
    )
    out = tmp_path / "b"
    results = run_test(test, "stub-families", out, jobs=2)
    dirs = [r.run_dir for r in results if not (r.arm == "basin-n60" and r.seed > 0)] + [str(tmp_path / "gone")]
    rc = report_runs(dirs, out / "a", test_path=str(test), rule=None, refs=None)
    v = json.loads((out / "a" / "verdict.json").read_text())
    assert v["groups"][0]["seeds"]["1"]["roles"]["n60"]["status"] == "MISSING"
    assert (v["verdict"] == "INCOMPLETE") == (rc == 1)


def test_a_family_refuses_before_any_run_a_test_without_its_required_arms(tiny: Path, tmp_path: Path) -> None:
    from harness.errors import ConfigError

    test = _write_test(tiny, "tiny-basin-40", "rule: basin-2\narms: [basin-n40]\nrates: [1.65]\nseeds: [0]\n")
    with pytest.raises(ConfigError, match="role 'n60' needs an arm in \\['basin-n60'\\]"):
        run_test(test, "stub-families", tmp_path / "x", jobs=1)
    assert not (tmp_path / "x").exists()
