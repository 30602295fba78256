"""Command: `analyze` (a verdict from existing run directories), and the report step that the
test runner's `test run` ends with (`report_runs`).

This module reads run records and test configs only; it never imports a driver, a runner or a
server adapter, so the judging half can be re-run by a reviewer with nothing that executes runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence


def refs_override(args: argparse.Namespace) -> dict[str, float] | None:
    """The references given on the command line (`--lambda-ref`, `--all-miss-rate`), if any."""
    out = {}
    if getattr(args, "lambda_ref", None):
        out["lambda_ref"] = float(args.lambda_ref)
    if getattr(args, "all_miss_rate", None):
        out["all_miss_token_rate"] = float(args.all_miss_rate)
    return out or None


def add_ref_options(p: argparse.ArgumentParser) -> None:
    """The rule and reference options shared by `analyze` and `test run`."""
    p.add_argument("--rule", help="rule spec YAML (default: the registered E2 rule)")
    p.add_argument("--lambda-ref", type=float, help="override the cell's lambda_ref in the rule (sessions/s)")
    p.add_argument("--all-miss-rate", type=float, help="override the cell's E0a all-miss token rate in the rule")


def report_runs(run_dirs: Sequence[str], out_dir: Path, *, test_path: str | None, rule: str | None, refs: dict[str, float] | None) -> int:
    """Score run directories, write verdict JSON + Markdown + figure to `out_dir`, print the tables.

    Returns the exit status: 0 when the test PASSES, 1 otherwise.
    """
    from analysis.report import analyze, markdown_table, runs_table, write_report

    arms = rates = seeds = None
    name = None
    if test_path:
        from harness.config import load_test

        b = load_test(test_path)
        arms, rates, seeds, name = list(b.arms), list(b.test.rates), list(b.test.seeds), b.test.name
        rule = rule or (str(b.rule_path) if b.rule_path else None)  # the test's own rule unless overridden
    verdict, analyzed = analyze(run_dirs, rule=rule, arms=arms, rates=rates, seeds=seeds, refs_override=refs, test_name=name)
    paths = write_report(verdict, analyzed, out_dir)
    print()
    print(markdown_table(verdict))
    print()
    print(runs_table(verdict))
    print()
    print(f"verdict: {paths['verdict']}")
    print(f"report:  {paths['report']}")
    print(f"figure:  {paths['figure']}")
    return 0 if verdict["verdict"] == "PASS" else 1


def _cmd_analyze(args: argparse.Namespace) -> int:
    if getattr(args, "registration", None):
        from analysis.registered import cmd

        return cmd(args)
    dirs: list[str] = []
    for d in args.runs:
        p = Path(d)
        if (p / "meta.json").exists():
            dirs.append(str(p))
        else:  # a test output folder: every run directory under it
            dirs += sorted(str(x.parent) for x in p.glob("*/meta.json"))
    if not dirs:
        print("no run directories found", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(os.path.commonpath(dirs)) / "analysis"
    return report_runs(dirs, out, test_path=args.test, rule=args.rule, refs=refs_override(args))


def register(cli: Any) -> None:
    """Add `analyze` to the agentload command."""
    a = cli.command("analyze", group="judge", help="score run directories with a registered rule; write verdict, report, figure")
    a.add_argument("runs", nargs="+", help="run directories, or folders holding them")
    a.add_argument("--test", help="the test YAML: its arms, rates and seeds are the registered ones (missing runs count)")
    a.add_argument("--out", help="report folder (default: <common parent>/analysis)")
    a.add_argument("--registration", help="judge as registered: the registration's rule and references, only its bound runs, "
                                          "the analysis code of its commit (see analysis/registered.py)")  # fmt: skip
    add_ref_options(a)
    a.set_defaults(func=_cmd_analyze)
    from analysis.registered import RegisteredAnalysisError

    cli.user_errors(RegisteredAnalysisError)
