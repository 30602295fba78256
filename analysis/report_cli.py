"""Commands: `status TESTDIR` (where a test stands) and `report TESTDIR [--html]` (its report:
the Markdown beside the verdict, or one self-contained HTML page).

Both read the test directory through analysis.testdir, which reads each record through the reader
of the part that writes it; neither runs anything, so a reviewer can use them on a copied test
directory with nothing but this package.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _open(args: argparse.Namespace) -> Any:
    from analysis.testdir import open_testdir

    repo = None
    if getattr(args, "repo", None):
        from provenance.git import Repo

        repo = Repo.containing(Path(args.repo))
    return open_testdir(args.testdir, repo=repo, registration=getattr(args, "registration", None))


def _cmd_status(args: argparse.Namespace) -> int:
    from analysis.status import format_status, collect_status

    st = collect_status(_open(args), ask_scheduler=not args.no_scheduler)
    print(json.dumps(st, indent=2, default=str) if args.json else format_status(st))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    td = _open(args)
    if args.html:
        from analysis.html import write_html

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


def register(cli: Any) -> None:
    """Add `status` and `report` to the agentload command."""
    s = cli.command("status", group="judge", help="where a test stands: registration and label, predictions, jobs, runs bound, verdict, provenance breaks")
    s.add_argument("testdir", help="the test directory (submission.json, runs/, provenance/, the verdict)")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.add_argument("--no-scheduler", action="store_true", help="do not ask the scheduler; job states from the accounting export only")
    s.add_argument("--registration", help="the registration file, for a test not yet submitted (its status and the label jobs submitted now would get)")
    s.add_argument("--repo", help="repository holding the registration and freezes (default: the test directory's, else .)")
    s.set_defaults(func=_cmd_status)

    r = cli.command("report", group="judge", help="a test's report: the Markdown tables, or with --html one self-contained page for a reviewer")
    r.add_argument("testdir", help="the test directory")
    r.add_argument("--html", action="store_true", help="write one self-contained HTML page (works offline)")
    r.add_argument("--out", help="HTML file to write (default <testdir>/report.html)")
    r.add_argument("--registration", help="the registration file, for a test not yet submitted")
    r.add_argument("--repo", help="repository holding the registration and freezes (default: the test directory's, else .)")
    r.set_defaults(func=_cmd_report)
