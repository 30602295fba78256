"""Action: `agentload jobs collect MANIFEST`: the accounting export, the run directories, failures
with their reasons, then the registered analysis (review/registered.py) of what was collected.

A module of its own (cli.commands.ACTIONS): the registered analysis imports the rule engine and
pandas, which `jobs status` (cli/jobs.py) has no use for.
"""

from __future__ import annotations

from typing import Any

from review.registered import collection_verdict
from slurm.collect import collect, dump, format_collection


def _cmd_collect(args: Any) -> int:
    res = collect(
        args.manifest,
        wait_s=args.wait,
        judge=None if args.no_analysis else collection_verdict,
        echo=None if args.json else lambda m: print(m, flush=True),
    )
    print(dump(res) if args.json else format_collection(res))
    ok = (
        res["complete"]
        and not res["not_completed"]
        and not res["agreement"]
        and (args.no_analysis or (res.get("analysis") or {}).get("ran"))
    )
    return 0 if ok else 1


def register(cli: Any) -> None:
    """Fill `agentload jobs collect`'s parser (cli/jobs.py adds it)."""
    c = cli.action_parser("jobs", "collect")
    c.add_argument("manifest", help="<testdir>/submission.json (or the test directory)")
    c.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to this long for every job to end"
    )
    c.add_argument("--no-analysis", action="store_true", help="skip the registered analysis")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_collect)
