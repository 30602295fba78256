"""Command: `agentload submit REG.yaml` (slurm/README.md); `agentload jobs` is cli/jobs.py."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

from slurm.job_options import add_job_options, job_options_from_args
from slurm.submit import SubmitOptions, format_plan, submit_registration


def _engine_options(args: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.server_cmd:
        opts["server_cmd"] = shlex.split(args.server_cmd)
    if args.model_path:
        opts["model"] = args.model_path
    if args.served_model_name:
        opts["served_model_name"] = args.served_model_name
    if args.engine_arg:
        opts["extra_args"] = list(args.engine_arg)
    if args.flavor:
        opts["flavor"] = args.flavor
    if args.health_timeout is not None:
        opts["health_timeout"] = float(args.health_timeout)
    if args.request_timeout is not None:
        opts["request_timeout"] = float(args.request_timeout)
    return opts


def _cmd_submit(args: Any) -> int:
    opts = SubmitOptions(
        executor=args.executor,
        engine=args.engine,
        time_scale=args.time_scale,
        engine_options=_engine_options(args),
        dry_run=args.dry_run,
        exploratory=args.exploratory,
        out=args.out,
        remote=args.remote,
        branch=args.branch,
        job=job_options_from_args(args),
        accept_undecidable=args.accept_undecidable,
    )
    doc = submit_registration(args.registration, opts, echo=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "_path"}, indent=2, default=str))
    else:
        print(format_plan(doc))
        if not doc.get("dry_run"):
            print(
                f"manifest: {doc['_path']}\nnext: agentload jobs status {doc['_path']}; agentload jobs collect "
                f"{doc['_path']}"
            )
    return 0


def register(cli: Any) -> None:
    """Add `agentload submit`."""
    p = cli.command(
        "submit",
        group="execute",
        help="submit every arm x rate x seed of a registration as jobs (SLURM via submitit, or local)",
    )
    p.add_argument("registration", help="the registration file (prereg/registrations/*.yaml), committed (and pushed)")
    p.add_argument("--executor", choices=("slurm", "local"), default="slurm", help="SLURM (default) or local processes")
    p.add_argument(
        "--engine",
        help="engine backend of every job: sglang | vllm | emulator[:flavor] | sim (default: the cell's engine)",
    )
    p.add_argument("--time-scale", type=float, help="emulator only: plan seconds per wall second")
    p.add_argument("--dry-run", action="store_true", help="check and print what would be submitted; submit nothing")
    p.add_argument(
        "--exploratory",
        action="store_true",
        help="accept an EXPLORATORY or uncommitted registration (runs are exploratory)",
    )
    p.add_argument(
        "--accept-undecidable",
        action="store_true",
        help="submit a registration whose rule can only FAIL by design, or that its bound design record finds not "
        "decisive (refused otherwise, with the reason and what design would be decisive); the manifest records it",
    )
    p.add_argument("--out", help="test directory (default: results/submissions/<registration>-<time>)")
    p.add_argument("--remote", help="git remote to ask (default: the branch's upstream, else origin)")
    p.add_argument("--branch", help="remote branch to ask (default: the upstream branch)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    add_job_options(p, time_default="from the protocol with a margin (slurm/budget.py)")
    g = p.add_argument_group("engine launch (as for `agentload run`)")
    g.add_argument("--server-cmd", help="launcher prefix replacing the engine's default program")
    g.add_argument("--model-path", help="weights the engine loads (default: the cell's model)")
    g.add_argument("--served-model-name")
    g.add_argument("--flavor", choices=("sglang", "vllm"), help="emulator API dialect (default: the cell's engine)")
    g.add_argument(
        "--engine-arg", action="append", default=[], metavar="ARG", help="extra server argument (repeatable)"
    )
    g.add_argument("--health-timeout", type=float, help="seconds to wait for the server's /health")
    g.add_argument("--request-timeout", type=float, help="wall seconds per turn before it is a timeout")
    p.set_defaults(func=_cmd_submit)
