"""`agentload report TESTDIR [--html]`: a test's report (the Markdown beside the verdict, or one
self-contained HTML page). `analyze` (a verdict from run directories) is cli/analyze.py's and
`status TESTDIR` cli/status.py's: neither needs what `report` imports.

`report` reads the test directory through review.testdir, which reads each record through the
reader of the part that writes it; none of them runs anything, so a reviewer can use them on a
copied test directory.
"""

from __future__ import annotations

import argparse

from cli.commands import CLI
from cli.status import open_test
from review.html import write_html


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
    """Add `report` to the agentload command."""
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
