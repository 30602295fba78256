"""`agentload analyze RUNS...`: a verdict from run directories, plain or as registered (verdict.json,
report.md and figure.png; analysis/judge.py).

A module of its own, apart from `report` (cli/review.py): `report` reads a whole test directory
(review.testdir through cli.status) and writes the HTML page (review.html), none of which `analyze`
uses; importing them cost each `analyze` about a tenth of a second (issue 24,
benchmarks/bench_commands.py). Its row in the command table asks for a figure process
(`Command.figure`), which `agentload` forks before importing this module, so that the child's
import of matplotlib runs beside this module's import of the scoring; the runs are scored by as many
processes as the machine has CPUs (analysis.forking).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analysis.forking import cpus
from analysis.judge import report_runs
from analysis.ref_options import add_ref_options, refs_override
from cli.commands import CLI
from review.registered import cmd


def register(cli: CLI) -> None:
    """Add `analyze` to the agentload command."""
    a = cli.command(
        "analyze", group="judge", help="score run directories with a registered rule; write verdict, report, figure"
    )
    a.add_argument("runs", nargs="+", help="run directories, or folders holding them")
    a.add_argument(
        "--test", help="the test YAML: its arms, rates and seeds are the registered ones (missing runs count)"
    )
    a.add_argument("--out", help="report folder (default: <common parent>/analysis)")
    a.add_argument(
        "--registration",
        help="judge as registered: the registration's rule and references, only its bound runs, "
        "the analysis code of its commit (see analysis/registered.py)",
    )
    a.add_argument(
        "--predictions",
        help="frozen prediction file (default: the test's; 'freeze' tests: predictions.json beside the runs)",
    )
    add_ref_options(a)
    a.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    if getattr(args, "registration", None):
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
    return report_runs(
        dirs,
        out,
        test_path=args.test,
        rule=args.rule,
        refs=refs_override(args),
        predictions=args.predictions,
        figures=getattr(args, "figures", None),  # forked by cli.main before this module was imported
        workers=cpus(),
    )
