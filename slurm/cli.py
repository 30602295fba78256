"""Commands: `agentload submit REG.yaml` and `agentload jobs status|collect MANIFEST` (slurm/README.md)."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any


def _kv(items: list[str], flag: str) -> dict[str, str]:
    from harness.cli import CLIError

    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise CLIError(f"{flag} {it!r}: expected NAME=VALUE")
        out[k] = v
    return out


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
    from slurm.submit import SubmitOptions, format_plan, submit_registration

    opts = SubmitOptions(
        executor=args.executor, engine=args.engine, time_scale=args.time_scale, engine_options=_engine_options(args),
        partition=args.partition, time=args.time, dry_run=args.dry_run, exploratory=args.exploratory, out=args.out,
        remote=args.remote, branch=args.branch, parallel=args.parallel, cpus_per_task=args.cpus_per_task, mem=args.mem,
        gres=args.gres, account=args.account, qos=args.qos, python=args.python, job_env=_kv(args.job_env, "--job-env"),
        accept_undecidable=args.accept_undecidable,
    )  # fmt: skip
    doc = submit_registration(args.registration, opts, echo=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "_path"}, indent=2, default=str))
    else:
        print(format_plan(doc))
        if not doc.get("dry_run"):
            print(f"manifest: {doc['_path']}\nnext: agentload jobs status {doc['_path']}; agentload jobs collect {doc['_path']}")
    return 0


def _cmd_status(args: Any) -> int:
    from slurm.collect import format_table, status

    st = status(args.manifest)
    if args.json:
        print(json.dumps(st, indent=2, default=str))
    else:
        print(f"{st['registration']}: {st['manifest']}")
        print(format_table(st["jobs"]))
    return 0


def _cmd_collect(args: Any) -> int:
    from slurm.collect import collect, dump, format_collection

    res = collect(args.manifest, wait_s=args.wait, analysis=not args.no_analysis, echo=None if args.json else lambda m: print(m, flush=True))
    print(dump(res) if args.json else format_collection(res))
    ok = res["complete"] and not res["not_completed"] and not res["agreement"] and (args.no_analysis or (res.get("analysis") or {}).get("ran"))
    return 0 if ok else 1


def register(cli: Any) -> None:
    """Add `agentload submit` and `agentload jobs status|collect`."""
    from slurm.manifest import ManifestError
    from slurm.submit import SubmitRefused

    cli.user_errors(SubmitRefused, ManifestError)
    p = cli.command("submit", group="execute", help="submit every arm x rate x seed of a registration as jobs (SLURM via submitit, or local)")
    p.add_argument("registration", help="the registration file (prereg/registrations/*.yaml), committed (and pushed)")
    p.add_argument("--executor", choices=("slurm", "local"), default="slurm", help="SLURM (default) or local processes")
    p.add_argument("--engine", help="engine backend of every job: sglang | vllm | emulator[:flavor] | sim (default: the cell's engine)")
    p.add_argument("--time-scale", type=float, help="emulator only: plan seconds per wall second")
    p.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    p.add_argument("--time", help="per-job limit as sbatch reads it (minutes, HH:MM:SS, D-HH:MM); default: from the protocol with a margin")
    p.add_argument("--dry-run", action="store_true", help="check and print what would be submitted; submit nothing")
    p.add_argument("--exploratory", action="store_true", help="accept an EXPLORATORY or uncommitted registration (runs are exploratory)")
    p.add_argument("--accept-undecidable", action="store_true",
                   help="submit a registration whose rule can only FAIL by design, or that its bound design record finds not decisive "
                        "(refused otherwise, with the reason and what design would be decisive); the manifest records it")
    p.add_argument("--out", help="test directory (default: results/submissions/<registration>-<time>)")
    p.add_argument("--remote", help="git remote to ask (default: the branch's upstream, else origin)")
    p.add_argument("--branch", help="remote branch to ask (default: the upstream branch)")
    p.add_argument("--parallel", type=int, help="jobs running at once (SLURM array parallelism; local: processes, default 1)")
    p.add_argument("--cpus-per-task", type=int, default=1)
    p.add_argument("--mem", help="memory per job, as sbatch --mem")
    p.add_argument("--gres", help="generic resources per job, e.g. gpu:1")
    p.add_argument("--account")
    p.add_argument("--qos")
    p.add_argument("--python", help="interpreter the jobs run (default: this one)")
    p.add_argument("--job-env", action="append", default=[], metavar="NAME=VALUE", help="environment variable for every job (repeatable)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    g = p.add_argument_group("engine launch (as for `agentload run`)")
    g.add_argument("--server-cmd", help="launcher prefix replacing the engine's default program")
    g.add_argument("--model-path", help="weights the engine loads (default: the cell's model)")
    g.add_argument("--served-model-name")
    g.add_argument("--flavor", choices=("sglang", "vllm"), help="emulator API dialect (default: the cell's engine)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="ARG", help="extra server argument (repeatable)")
    g.add_argument("--health-timeout", type=float, help="seconds to wait for the server's /health")
    g.add_argument("--request-timeout", type=float, help="wall seconds per turn before it is a timeout")
    p.set_defaults(func=_cmd_submit)

    j = cli.command("jobs", group="execute", help="scheduler states of a submission's jobs; collect their runs, accounting and verdict")
    j.set_defaults(func=None, _parser=j)
    sub = j.add_subparsers(dest="jobs_command", metavar="ACTION")
    s = sub.add_parser("status", help="each job's scheduler state and run status")
    s.add_argument("manifest", help="<testdir>/submission.json (or the test directory)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_status)
    c = sub.add_parser("collect", help="accounting export, run directories, failures with reasons, then the registered analysis")
    c.add_argument("manifest", help="<testdir>/submission.json (or the test directory)")
    c.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to this long for every job to end")
    c.add_argument("--no-analysis", action="store_true", help="skip the registered analysis")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_collect)
