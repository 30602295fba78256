"""`agentload status TESTDIR`: where a test stands (registration and label, predictions, jobs, runs
bound, verdict, provenance breaks), as text or JSON.

A module of its own, apart from `analyze` (cli/analyze.py) and `report` (cli/review.py): status
reads records and asks git and the scheduler, and judges nothing, so its command must not pay for
importing the judge (numpy, pandas, pyarrow) or the HTML page's charts: about half of what the
command cost when it shared their module (benchmarks/bench_commands.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli.commands import CLI
from provenance.git import Repo
from review.status import collect_status, format_status
from review.testdir import open_testdir


def open_test(args: argparse.Namespace) -> Any:
    """The test directory `args.testdir`, with the repository `--repo` names (default: its own, else
    the working directory's) and the registration `--registration` names, if any."""
    repo = None
    if getattr(args, "repo", None):
        repo = Repo.containing(Path(args.repo))
    return open_testdir(args.testdir, repo=repo, registration=getattr(args, "registration", None))


def _cmd_status(args: argparse.Namespace) -> int:
    st = collect_status(open_test(args), ask_scheduler=not args.no_scheduler)
    print(json.dumps(st.to_json(), indent=2, default=str) if args.json else format_status(st))
    return 0


def register(cli: CLI) -> None:
    """Add `status` to the agentload command."""
    s = cli.command(
        "status",
        group="judge",
        help="where a test stands: registration and label, predictions, jobs, runs bound, verdict, provenance breaks",
    )
    s.add_argument("testdir", help="the test directory (submission.json, runs/, provenance/, the verdict)")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not ask the scheduler; job states from the accounting export only",
    )
    s.add_argument(
        "--registration",
        help="the registration file, for a test not yet submitted (its status and the label jobs submitted now would "
        "get)",
    )
    s.add_argument(
        "--repo", help="repository holding the registration and freezes (default: the test directory's, else .)"
    )
    s.set_defaults(func=_cmd_status)
