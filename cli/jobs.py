"""Command: `agentload jobs status|collect MANIFEST` (slurm/README.md).

`jobs status` is asked over and over while a submission's jobs run: it reads the manifest and asks
the scheduler. `jobs collect` ends with the registered analysis (the rule engine, pandas), so it has
a module of its own (cli/jobs_collect.py, listed in cli.commands.ACTIONS) that `jobs status` does
not import (issue 24: 0.9 s of imports per `jobs status` before).
"""

from __future__ import annotations

import json
from typing import Any

from slurm.collect import format_table, status


def _cmd_status(args: Any) -> int:
    st = status(args.manifest)
    if args.json:
        print(json.dumps(st, indent=2, default=str))
    else:
        print(f"{st['registration']}: {st['manifest']}")
        print(format_table(st["jobs"]))
    return 0


def register(cli: Any) -> None:
    """Add `agentload jobs status` (and the parser of `jobs collect`, which cli/jobs_collect.py fills)."""
    j = cli.command(
        "jobs",
        group="execute",
        help="scheduler states of a submission's jobs; collect their runs, accounting and verdict",
    )
    j.set_defaults(func=None, _parser=j)
    sub = j.add_subparsers(dest="jobs_command", metavar="ACTION")
    s = sub.add_parser("status", help="each job's scheduler state and run status")
    s.add_argument("manifest", help="<testdir>/submission.json (or the test directory)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_status)
    cli.deferred_action(sub, "jobs", "resubmit")
    cli.deferred_action(sub, "jobs", "collect")
