"""Commands of the review: `analyze` (a verdict from run directories, plain or as registered) and
`report TESTDIR [--html]` (its report: the Markdown beside the verdict, or one self-contained HTML
page). `status TESTDIR` is cli/status.py's: it judges nothing, so it does not import the judge.

`report` reads the test directory through review.testdir, which reads each record through the
reader of the part that writes it; none of them runs anything, so a reviewer can use them on a
copied test directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analysis.judge import add_ref_options, refs_override, report_runs
from cli.commands import CLI
from cli.status import open_test
from review.html import write_html
from review.registered import cmd


def _cmd_report(args: argparse.Namespace) -> int:
    td = open_test(args)
    if args.html:
        out = write_html(td, args.out)
        print(f"report: {out} ({out.stat().st_size / 1024:.0f} KiB, self-contained; open it in a browser)")
        return 0
    md = td.sibling("report.md")
    if md is None:
        print(f"no Markdown report in {td.path}: {td.verdict.note or 'report.md is not beside the verdict'}")
        return 1
    reg = td.sibling("registered-report.md")
    if reg is not None:
        print(reg.read_text(encoding="utf-8"))
    print(md.read_text(encoding="utf-8"))
    print(f"(from {md})")
    return 0


def register(cli: CLI) -> None:
    """Add `analyze` and `report` to the agentload command."""
    _register_analyze(cli)

    r = cli.command(
        "report",
        group="judge",
        help="a test's report: the Markdown tables, or with --html one self-contained page for a reviewer",
    )
    r.add_argument("testdir", help="the test directory")
    r.add_argument("--html", action="store_true", help="write one self-contained HTML page (works offline)")
    r.add_argument("--out", help="HTML file to write (default <testdir>/report.html)")
    r.add_argument("--registration", help="the registration file, for a test not yet submitted")
    r.add_argument(
        "--repo", help="repository holding the registration and freezes (default: the test directory's, else .)"
    )
    r.set_defaults(func=_cmd_report)


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
        dirs, out, test_path=args.test, rule=args.rule, refs=refs_override(args), predictions=args.predictions
    )


def _register_analyze(cli: CLI) -> None:
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
