"""The agentload command: grouped help, plan make / show, and user errors without tracebacks."""

from __future__ import annotations

import gc
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from cli.commands import ACTIONS, COMMANDS, GROUPS, modules_for
from cli.main import build, main
from harness.workload.planfile import read_plan

MAKE = ["plan", "make", "--workload", "standard", "--protocol", "e2", "--arm", "burst", "--rate", "1.35", "--seed", "1"]


def test_help_lists_only_implemented_commands_grouped(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "plan" in out and "Workload: freeze what the client will send" in out
    registered = set(build().registered)  # every module in the table registers its commands
    assert registered == {c.name for c in COMMANDS}
    assert {
        "plan",
        "calibrate",
        "prereg",
        "submit",
        "jobs",
        "theory",
        "run",
        "test",
        "analyze",
        "emulator",
        "predict",
        "provenance",
        "status",
        "report",
    } <= registered
    for name in registered:
        assert f"\n    {name} " in out  # every registered command is listed under its group
    assert [g for g, _ in GROUPS] == ["workload", "calibrate", "execute", "judge"]


def _imported_by(argv: list[str], matches: str) -> str:
    """The sorted modules a fresh interpreter holds after `main(argv)` (its --help: nothing runs)
    whose name satisfies `matches`, a Python expression in `m`, printed as a list."""
    code = (
        f"import sys; from cli.main import main\ntry:\n    main({argv!r})\nexcept SystemExit: pass\n"
        f"print(sorted(m for m in sys.modules if {matches}))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


def test_help_imports_no_command_module() -> None:
    """`agentload --help` is the table: no command's module (nor numpy, pandas, pydantic) is imported."""
    got = _imported_by(["--help"], "m.split('.')[0] in ('numpy', 'pandas', 'pydantic', 'runs', 'analysis', 'review')")
    assert got == "[]", got


def test_a_command_imports_only_its_own_module() -> None:
    got = _imported_by(["plan", "--help"], "m.startswith('cli.')")
    assert got == "['cli.commands', 'cli.main', 'cli.plan']", got


def test_analyze_imports_nothing_only_report_reads() -> None:
    """`analyze` (cli/analyze.py) imports neither the test directory's reader nor the HTML page,
    which only `report` uses (issue 24), nor matplotlib before it draws."""
    got = _imported_by(["analyze", "--help"], "m.startswith(('cli.', 'review.html', 'review.testdir', 'matplotlib'))")
    assert got == "['cli.analyze', 'cli.commands', 'cli.main']", got


@pytest.mark.parametrize(
    "argv",
    [["prereg", "check", "--help"], ["jobs", "status", "--help"], ["predict", "freeze", "--help"]],
    ids=["prereg-check", "jobs-status", "predict-freeze"],
)
def test_light_actions_import_neither_the_simulator_nor_pandas(argv: list[str]) -> None:
    """The actions a user repeats between runs (check a registration, ask the scheduler, freeze a
    prediction) share their command with heavy ones (design, collect, make, score), whose modules of
    their own (cli.commands.ACTIONS) import the simulator, the run code and the rule engine only when
    they run (issue 24)."""
    got = _imported_by(argv, "m.split('.')[0] in ('pandas', 'runs', 'matplotlib') or m == 'analysis.staged_analysis'")
    assert got == "[]", got


def test_every_deferred_action_is_added_by_its_command_and_filled_by_its_module() -> None:
    cli = build()  # every module: commands' first, then the actions'
    assert sorted(cli.filled) == sorted((a.command, a.name) for a in ACTIONS)
    assert modules_for(["prereg", "check", "x.yaml"]) == ["cli.prereg"]
    assert modules_for(["prereg", "design", "--inputs", "d"]) == ["cli.prereg", "cli.design"]
    assert modules_for(["--debug", "jobs", "collect", "m.json"]) == ["cli.jobs", "cli.jobs_collect"]
    assert modules_for(["--help"]) == [] and modules_for(["nosuch", "design"]) == []


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: f"{a.command}-{a.name}")
def test_a_deferred_action_is_listed_without_its_module_and_parsed_with_it(action, capsys) -> None:
    """`agentload CMD --help` lists the action with its row's help (its module not imported);
    `agentload CMD ACTION --help` shows the options its module adds."""
    with pytest.raises(SystemExit):
        main([action.command, "--help"])
    listed = " ".join(capsys.readouterr().out.split())
    assert f"{action.name} {action.help}" in listed
    with pytest.raises(SystemExit):
        main([action.command, action.name, "--help"])
    out = capsys.readouterr().out
    assert "--" in out.split("options:")[1]  # options beyond -h: the action module filled its parser
    got = _imported_by([action.command, "--help"], f"m == {action.module!r}")
    assert got == "[]", got
    assert _imported_by([action.command, action.name, "--help"], f"m == {action.module!r}") == f"[{action.module!r}]"


def test_only_the_process_command_freezes_the_collector() -> None:
    """`main()` (the process's own command) freezes what it imported (cli/main.py); `main(argv)`, as
    the tests call it, leaves the collector as it was."""
    code = (
        "import gc, sys; from cli.main import main\nsys.argv = ['agentload', 'plan', '--help']\n"
        "try:\n    main()\nexcept SystemExit: pass\nprint(gc.get_freeze_count() > 0, gc.isenabled())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip().splitlines()[-1] == "True True", r.stdout
    frozen, enabled = gc.get_freeze_count(), gc.isenabled()
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert gc.get_freeze_count() == frozen and gc.isenabled() == enabled


def test_an_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nosuch'" in err and "Traceback" not in err


def test_console_script_help() -> None:
    r = subprocess.run([sys.executable, "-m", "cli.main", "plan", "make", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--lambda-ref" in r.stdout and "--cell" in r.stdout


def test_plan_make_prints_the_file_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.parquet"
    assert main([*MAKE, "--cell", "sglang-a100-300k", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    digest, path = line.split()
    assert path == str(out) and digest == hashlib.sha256(out.read_bytes()).hexdigest()
    plan = read_plan(out)
    assert plan.lambda_ref == 0.071534 and plan.meta["seed"] == 1 and plan.meta["counts"]["burst"] == 200
    # the same plan through --lambda-ref, in another file: same bytes
    out2 = tmp_path / "q.parquet"
    assert main([*MAKE, "--lambda-ref", "0.071534", "--out", str(out2)]) == 0
    assert out2.read_bytes() == out.read_bytes()


def test_plan_show_reports_rates_and_ks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.parquet"
    main([*MAKE, "--cell", "sglang-a100-300k", "--out", str(out)])
    capsys.readouterr()
    assert main(["plan", "show", str(out), "--rows", "3"]) == 0
    text = capsys.readouterr().out
    for needle in (
        "sessions and turns",
        "evaluation window",
        "[5700, 8700)",
        "before burst",
        "whole run",
        "burst sessions",
        "KS test",
        "sha256",
    ):
        assert needle in text, needle
    assert main(["plan", "show", str(out), "--rows", "0", "--window", "0:600", "--window", "600:8700"]) == 0
    text = capsys.readouterr().out
    assert "[0, 600)" in text and "evaluation window" not in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["plan", "show", "/nonexistent/plan.parquet"], "cannot read plan"),
        ([*MAKE, "--lambda-ref", "0.07", "--workload", "nope"], "config 'workloads/nope' not found"),
        ([*MAKE[:-2], "--seed", "0", "--rate", "99", "--lambda-ref", "0.0715"], "top rate"),
        ([*MAKE, "--cell", "llama-a100-300k", "--lambda-ref", "0.1"], "not allowed with argument"),
    ],
)
def test_user_errors_exit_2_without_traceback(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main([*argv, "--out", str(tmp_path / "x.parquet")] if argv[1] == "make" else argv)
    except SystemExit as ex:  # argparse's own errors
        code = ex.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


def test_bad_config_file_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "arm.yaml"
    bad.write_text("kind: arm\nname: a\nburts: true\n")
    code = main(
        [
            *MAKE[:6],
            "--arm",
            str(bad),
            "--rate",
            "1.35",
            "--seed",
            "0",
            "--lambda-ref",
            "0.07",
            "--out",
            str(tmp_path / "x.parquet"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "burts: unknown key" in err and "Traceback" not in err


def test_cell_without_lambda_ref_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cell = tmp_path / "c.yaml"
    cell.write_text(
        "kind: cell\nname: c\nengine: {name: sglang, version: '0.5.22'}\nmodel: m\ngpu: g\nkv_pool_tokens: 300000\n"
    )
    assert main([*MAKE, "--cell", str(cell), "--out", str(tmp_path / "x.parquet")]) == 2
    assert "has no lambda_ref" in capsys.readouterr().err


def test_bare_group_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert "make" in capsys.readouterr().err
