"""Action: `agentload jobs resubmit MANIFEST`: submit again, unchanged, the jobs whose run never
started (slurm/resubmit.py).

A module of its own (cli.commands.ACTIONS): it imports the job's code (slurm.job, to rebuild the job
specs), which `jobs status` (cli/jobs.py) has no use for.
"""

from __future__ import annotations

from typing import Any

from slurm.resubmit import resubmit


def _cmd_resubmit(args: Any) -> int:
    rec = resubmit(args.manifest, indices=args.job or None, dry_run=args.dry_run, echo=print)
    if args.dry_run:
        print(f"dry run: {len(rec['jobs'])} job(s) would be submitted again; nothing moved or submitted")
    else:
        print(f"resubmitted {len(rec['jobs'])} job(s) as {', '.join(rec['new_jobs'])}: the manifest records it")
        print(f"next: agentload jobs collect {args.manifest} --wait SECONDS")
    return 0


def register(cli: Any) -> None:
    """Fill `agentload jobs resubmit`'s parser (cli/jobs.py adds it)."""
    r = cli.action_parser("jobs", "resubmit")
    r.description = (
        "Submit again, with nothing changed, every finished job whose run ended before it sent a single turn "
        "(its meta.json REFUSED or FAILED, every record table empty): e.g. an engine whose speed pin did not "
        "settle. A job whose run started is never resubmitted, whatever its outcome. Its run directory moves to "
        "<testdir>/superseded/, and the manifest records both jobs (slurm/resubmit.py)."
    )
    r.add_argument("manifest", help="<testdir>/submission.json (or the test directory)")
    r.add_argument(
        "--job", type=int, action="append", metavar="INDEX", help="only this job (its # in `jobs status`; repeatable)"
    )
    r.add_argument("--dry-run", action="store_true", help="say which jobs would be resubmitted; change nothing")
    r.set_defaults(func=_cmd_resubmit)
