"""The test pipeline end to end with a stand-in engine: config -> frozen plan -> run directories ->
verdict JSON, Markdown and figure. The engine here is an infinite-server stub with a perfect cache,
so every arm ends good; what is checked is the plumbing, not the trap (tests/pipeline/test_e2_simulated.py)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from support.paths import REPO

from analysis.reports import write_report
from analysis.reports.e2 import markdown_table, runs_table
from analysis.rules import load_rule
from analysis.staged_analysis import analyze_staged
from harness.client.contract import Send, Timer, TurnResponse
from harness.config import load_test
from harness.recording.record import load_run
from harness.workload.planfile import read_plan
from runs.arms import execute_run
from runs.backend import BackendResult, RunContext, register_backend
from runs.suite import run_test


def _stub_backend(ctx: RunContext) -> BackendResult:
    """Every request answered 2 s after it is sent; follow-ups hit on all but the new ids."""
    client, heap, seq, prev = ctx.client, [], itertools.count(), {}

    def push(now: float, cmds) -> None:
        for c in cmds:
            if isinstance(c, Timer):
                heapq.heappush(heap, (c.at, next(seq), "t", c.key))
            else:
                heapq.heappush(heap, (now + 2.0, next(seq), "r", (now, c)))

    push(0.0, client.start(0.0))
    while heap and heap[0][0] < ctx.duration:
        now, _, kind, x = heapq.heappop(heap)
        if kind == "t":
            push(now, client.on_timer(now, x))
            continue
        sent, c = x
        assert isinstance(c, Send)
        n = len(c.prompt)
        out = np.zeros(c.max_tokens, np.int32)
        r = TurnResponse(c.request_id, "ok", sent, now, now - 1.0, out, n, prev.get(c.session, 0), c.max_tokens, 200)
        prev[c.session] = n + c.max_tokens
        push(now, client.on_response(now, r))
    return BackendResult("COMPLETED", None, ctx.duration, {"engine": {"backend": "stub"}})


register_backend("stub", _stub_backend)


@pytest.fixture()
def tiny_test(tmp_path: Path) -> Path:
    (tmp_path / "protocols").mkdir()
    (tmp_path / "protocols" / "tiny.yaml").write_text(
        "kind: protocol\nname: tiny\nduration: 1500.0\nburst: {time: 200.0, size: 20, width: 20.0}\n"
        "window: {start: 800.0, end: 1500.0}\nmin_window: 600.0\n"
    )
    (tmp_path / "t.yaml").write_text(
        "kind: test\nname: tiny-e2\ncell: sglang-a100-300k\nworkload: standard\nprotocol: protocols/tiny.yaml\n"
        "arms: [burst, noburst, capped]\nrates: [1.35]\nseeds: [0, 1, 2]\ncap: 5\n"
    )
    return tmp_path / "t.yaml"


def test_one_run_freezes_its_plan_and_records(tiny_test: Path, tmp_path: Path) -> None:
    bundle = load_test(tiny_test)
    res = execute_run(bundle, "CAPPED", 1.35, 0, "stub", tmp_path / "run")
    assert res.status == "COMPLETED"
    run = load_run(res.run_dir, verify=True)
    plan = read_plan(Path(res.run_dir) / "plan.parquet")
    assert run.meta["plan"]["sha256"] == plan.sha256
    assert run.meta["cap"] == 5 and run.meta["arm"] == "capped"
    assert run.meta["references"]["lambda_ref"] == pytest.approx(0.071534)
    assert len(run.sessions) == sum(1 for s in plan.sessions if s.arrival < 1500.0)
    assert set(run.gate_events["event"]) >= {"admit", "queue"}
    assert (run.turns["status"].isin(["ok", "unfinished"])).all()
    assert run.meta["client"]["requests"] == len(run.turns)


def test_test_run_and_report(tiny_test: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = run_test(tiny_test, "stub", out, jobs=2)
    assert len(results) == 9 and all(r.status == "COMPLETED" for r in results)
    verdict, analyzed = analyze_staged(
        [r.run_dir for r in results],
        load_rule("e2"),
        arms=["burst", "noburst", "capped"],
        rates=[1.35],
        seeds=[0, 1, 2],
    )
    states = {(r["arm"], r["seed"]): r["state"] for r in verdict["runs"]}
    assert all(states[("noburst", s)] == "RECOVERED" for s in range(3))
    assert all(states[("burst", s)] != "TRAPPED" for s in range(3))
    assert verdict["rates"][0]["verdict"] == "FAIL"
    paths, _ = write_report(verdict, analyzed, out / "analysis")
    assert json.loads(paths["verdict"].read_text())["verdict"] == "FAIL"
    md = paths["report"].read_text()
    assert "| 1.35 | NOBURST | GGG |" in md and "Per run" in md
    assert paths["figure"].stat().st_size > 10_000
    assert "BURST" in markdown_table(verdict) and "follow-up hit" in runs_table(verdict)


def test_missing_run_counts_as_missing(tiny_test: Path, tmp_path: Path) -> None:
    bundle = load_test(tiny_test)
    d = execute_run(bundle, "NOBURST", 1.35, 0, "stub", tmp_path / "a").run_dir
    verdict, _ = analyze_staged(
        [d, tmp_path / "does-not-exist"],
        load_rule("e2"),
        arms=["burst", "noburst", "capped"],
        rates=[1.35],
        seeds=[0, 1, 2],
    )
    seeds = verdict["rates"][0]["seeds"]
    assert seeds["0"]["burst"] == "MISSING" and seeds["1"]["noburst"] == "MISSING"
    assert verdict["rates"][0]["verdict"] == "INCOMPLETE"  # the missing runs could still make it pass


def test_display_degrades_to_log_lines_and_renders_live() -> None:
    import io

    from harness.recording.progress import TestDisplay
    from runs.arms import RunResult

    buf = io.StringIO()
    d = TestDisplay(stream=buf, live=False, log_every=0.0)
    d.start(["burst-r1.35-s0"], 8700.0)
    d.update({"key": "burst-r1.35-s0", "t": 4350.0, "in_system": 200, "held": 0, "hit": 0.0})
    d.finished("burst-r1.35-s0", RunResult("x", "burst", 1.35, 0, "COMPLETED", None, 3.0, 8700.0))
    d.stop()
    text = buf.getvalue()
    assert "running 1 runs" in text and "burst-r1.35-s0: COMPLETED" in text and "1/1 runs done" in text
    live = io.StringIO()
    d2 = TestDisplay(stream=live, live=True)
    d2.start(["a", "b"], 100.0)
    d2.update({"key": "a", "t": 50.0, "in_system": 3, "held": 1, "hit": 0.5})
    d2.stop()
    assert "plan time" in live.getvalue()


def test_cli_commands_are_registered() -> None:
    from cli import main as cli

    parser = cli.build().parser
    args = parser.parse_args(["test", "run", "configs/tests/e2-sglang-300k.yaml", "--engine", "sim", "--jobs", "2"])
    assert args.jobs == 2 and args.engine == "sim" and callable(args.func)
    args = parser.parse_args(["run", "--config", "x.yaml", "--arm", "BURST", "--rate", "1.65", "--seed", "0"])
    assert args.rate == 1.65 and args.engine == "sim"


# -------------------------------------------------------------------------------------------------
# what a real fast cell exposed (issue: the trap on a real engine with no GPU)
# -------------------------------------------------------------------------------------------------
def _boom_backend(ctx: RunContext) -> BackendResult:
    raise RuntimeError("engine exploded on purpose")


def _late_backend(ctx: RunContext) -> BackendResult:
    """The stub engine, with every arrival timer fired 0.3 s late (a client short of CPU)."""
    client, heap, seq, prev = ctx.client, [], itertools.count(), {}

    def push(now: float, cmds) -> None:
        for c in cmds:
            if isinstance(c, Timer):
                heapq.heappush(heap, (c.at + (0.3 if c.key[0] == "arrive" else 0.0), next(seq), "t", c.key))
            else:
                heapq.heappush(heap, (now + 2.0, next(seq), "r", (now, c)))

    push(0.0, client.start(0.0))
    while heap and heap[0][0] < ctx.duration:
        now, _, kind, x = heapq.heappop(heap)
        if kind == "t":
            push(now, client.on_timer(now, x))
            continue
        sent, c = x
        n = len(c.prompt)
        r = TurnResponse(
            c.request_id,
            "ok",
            sent,
            now,
            now - 1.0,
            np.zeros(c.max_tokens, np.int32),
            n,
            prev.get(c.session, 0),
            c.max_tokens,
            200,
        )
        prev[c.session] = n + c.max_tokens
        push(now, client.on_response(now, r))
    return BackendResult("COMPLETED", None, ctx.duration, {"engine": {"backend": "late"}})


register_backend("boom", _boom_backend)
register_backend("late", _late_backend)


def test_a_test_whose_runs_all_fail_ends_with_one_line_per_run(tiny_test: Path, tmp_path: Path, capsys) -> None:
    from cli import main as cli

    code = cli.main(
        ["test", "run", str(tiny_test), "--engine", "boom", "--jobs", "2", "--plain", "--out", str(tmp_path / "o")]
    )
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in out + err
    assert "no run completed: no verdict" in out
    tail = err.strip().splitlines()
    failed = [x for x in tail if ": FAILED: " in x]
    assert len(failed) == 9 and tail[-9:] == failed  # the output ends with them, one per run
    assert all(x.strip().endswith("RuntimeError: engine exploded on purpose") for x in failed)
    # asked for, the tracebacks come back
    code = cli.main(
        [
            "test",
            "run",
            str(tiny_test),
            "--engine",
            "boom",
            "--jobs",
            "2",
            "--plain",
            "--out",
            str(tmp_path / "o2"),
            "--debug",
        ]
    )
    assert code != 0 and "Traceback" in capsys.readouterr().err


def test_a_report_over_failed_runs_only_is_written_not_crashed(tiny_test: Path, tmp_path: Path) -> None:
    bundle = load_test(tiny_test)
    dirs = []
    for arm in ("burst", "noburst", "capped"):
        with contextlib.suppress(RuntimeError):
            execute_run(bundle, arm, 1.35, 0, "boom", tmp_path / arm)
        dirs.append(tmp_path / arm)
    verdict, analyzed = analyze_staged(
        dirs, load_rule("e2"), arms=["burst", "noburst", "capped"], rates=[1.35], seeds=[0, 1, 2]
    )
    assert {r["state"] for r in verdict["runs"]} == {"FAILED"}
    paths, _ = write_report(
        verdict, analyzed, tmp_path / "analysis"
    )  # the figure once crashed here (no legend entries)
    assert paths["figure"].stat().st_size > 0 and "| 1.35 | BURST | F-- |" in paths["report"].read_text()


def test_arms_given_by_file_are_recorded_and_judged_by_name(tiny_test: Path, tmp_path: Path) -> None:
    from analysis.judge import report_runs

    arms = REPO / "configs" / "arms"
    t = tmp_path / "by-file.yaml"
    t.write_text(
        tiny_test.read_text().replace(
            "arms: [burst, noburst, capped]", f"arms: [{arms / 'burst.yaml'}, {arms / 'noburst.yaml'}, capped]"
        )
    )
    results = run_test(t, "stub", tmp_path / "out", jobs=2)
    assert all(r.status == "COMPLETED" for r in results)
    assert {json.loads((Path(r.run_dir) / "meta.json").read_text())["arm"] for r in results} == {
        "burst",
        "noburst",
        "capped",
    }
    assert {Path(r.run_dir).name.split("-")[0] for r in results} == {"burst", "noburst", "capped"}
    # the verdict now finds an expectation for every arm (it used to raise RuleError after the runs)
    assert (
        report_runs([r.run_dir for r in results], tmp_path / "out" / "analysis", test_path=str(t), rule=None, refs=None)
        == 1
    )
    assert json.loads((tmp_path / "out" / "analysis" / "verdict.json").read_text())["arms"] == [
        "burst",
        "noburst",
        "capped",
    ]


def test_an_arm_the_rule_does_not_know_is_refused_before_any_run(tiny_test: Path, tmp_path: Path) -> None:
    from harness.errors import ConfigError

    t = tmp_path / "unknown-arm.yaml"
    t.write_text(tiny_test.read_text().replace("arms: [burst, noburst, capped]", "arms: [burst, toolslow-d30]"))
    with pytest.raises(ConfigError, match=r"no expectation for arm 'toolslow-d30'"):
        run_test(t, "stub", tmp_path / "out", jobs=1)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # and a cell without lambda_ref is refused once, not once per run
    (tmp_path / "cell.yaml").write_text(
        "kind: cell\nname: nolam\nengine: {name: sglang, version: x}\nmodel: m\ngpu: g\nkv_pool_tokens: 1000\n"
    )
    t2 = tmp_path / "nolam.yaml"
    t2.write_text(tiny_test.read_text().replace("cell: sglang-a100-300k", f"cell: {tmp_path / 'cell.yaml'}"))
    with pytest.raises(ConfigError, match="lambda_ref and all_miss_token_rate are needed"):
        run_test(t2, "stub", tmp_path / "out2", jobs=1)
    assert not (tmp_path / "out2").exists()


def test_late_session_starts_are_measured_flagged_and_not_gate_waits(tiny_test: Path, tmp_path: Path) -> None:
    from cli.run import _lateness

    bundle = load_test(tiny_test)
    res = execute_run(bundle, "NOBURST", 1.35, 0, "late", tmp_path / "late")
    meta = load_run(res.run_dir).meta
    ol = meta["open_loop"]
    assert ol["p50_s"] == pytest.approx(0.3) and ol["p99_s"] == pytest.approx(0.3) and ol["max_s"] == pytest.approx(0.3)
    assert ol["bound_p99_s"] == bundle.test.start_lateness_p99 == 0.1 and ol["within_bound"] is False
    assert (
        ol["n"] == meta["client"]["arrived"] and len(meta["warnings"]) == 1 and "not open-loop" in meta["warnings"][0]
    )
    assert res.warnings == meta["warnings"] and "p99 300.0 ms" in _lateness(res)
    assert ol["judged"] == "base" and ol["burst"]["n"] == 0
    burst = execute_run(bundle, "BURST", 1.35, 0, "late", tmp_path / "late-burst").open_loop
    assert burst["burst"]["n"] == 20 and burst["burst"]["p99_s"] == pytest.approx(0.3) and burst["n"] == ol["n"]
    # another seed: a verdict judges one run per arm, rate and seed (two would be refused as ambiguous)
    on_time = execute_run(bundle, "NOBURST", 1.35, 1, "stub", tmp_path / "on-time")
    assert on_time.open_loop["max_s"] == 0.0 and on_time.open_loop["within_bound"] is True and not on_time.warnings
    verdict, _ = analyze_staged(
        [res.run_dir, on_time.run_dir], load_rule("e2"), arms=["noburst"], rates=[1.35], seeds=[0, 1]
    )
    by_dir = {Path(r["run_dir"]).name: r for r in verdict["runs"]}
    # no gate: nothing waited at one, however late the client was
    assert by_dir["late"]["stats"]["gate_waited"] == 0 and by_dir["on-time"]["stats"]["gate_waited"] == 0
    assert verdict["open_loop"]["not_within"] == ["late"]
    assert "not open-loop within the registered bound" in runs_table(verdict) and "p99 300 ms > 100 ms" in runs_table(
        verdict
    )


def test_a_scaled_protocol_needs_a_rule_scaled_alike_before_any_run(tmp_path: Path) -> None:
    from harness.errors import ConfigError

    shipped = (REPO / "configs" / "tests" / "e2-vllm-cpu.yaml").read_text()
    t = tmp_path / "paper-rule.yaml"
    t.write_text(shipped.replace("rule: e2-cpu", "rule: e2"))
    with pytest.raises(
        ConfigError, match=r"rule 'e2' does not match protocol 'e2-cpu': min_window 600 \(protocol 12\)"
    ):
        run_test(t, "stub", tmp_path / "out", jobs=1)
    assert not (tmp_path / "out").exists()
    # the shipped test names its scaled rule and passes the check
    from runs.arms import check_before_runs

    check_before_runs(load_test(REPO / "configs" / "tests" / "e2-vllm-cpu.yaml"), "stub")
