"""`agentload predict make | freeze | score`: make prediction files, freeze them before the runs,
score them after, against the bytes the freeze tag holds.

`make` and `score` have modules of their own (cli/predict_make.py, cli/predict_score.py, listed in
cli.commands.ACTIONS): they import the simulator and the rule engine, which `freeze`, a git
operation, has no use for.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prereg.freeze import freeze
from provenance.git import Repo


def _cmd_freeze(args: argparse.Namespace) -> int:
    dirs = [Path(args.testdir) / "provenance" / "freezes"] if args.testdir else []
    if dirs and not args.no_repo_record:
        dirs.append(Repo.containing(Path(args.files[0])).path / "prereg" / "freezes")
    rec = freeze(
        args.files, tag=args.tag, remote=args.remote, branch=args.branch, record_dirs=dirs, message=args.message
    )
    d = rec.data
    print(
        f"froze {len(d['files'])} file(s) under tag {d['tag']} (commit "
        f"{d['commit'][:12]}{'' if d['new_commit'] else ', already committed'})"
    )
    for f in d["files"]:
        print(f"  sha256 {f['sha256']}  {f['path']}")
    print(f"remote {d['remote']['name']} ({d['remote']['url']}) holds commit and tag; confirmed at {d['confirmed_at']}")
    print(f"freeze record: {rec.path}")
    return 0


def register(cli: Any) -> None:
    """Add `agentload predict freeze` (and the parsers of `make` and `score`, which their modules fill)."""
    p = cli.command(
        "predict", group="calibrate", help="make prediction files, freeze them before the runs, score them after"
    )

    p.set_defaults(func=None, _parser=p)
    sub = p.add_subparsers(dest="predict_action", metavar="ACTION")
    cli.deferred_action(sub, "predict", "make")
    fr = sub.add_parser(
        "freeze", help="commit, tag (with each file's SHA-256), push and read back; write the freeze record"
    )
    fr.add_argument("files", nargs="+", help="prediction files (and any notes frozen with them)")
    fr.add_argument("--tag", help="tag name (default pred-<name>-<UTC time>)")
    fr.add_argument("--remote", help="git remote (default: the branch's upstream remote)")
    fr.add_argument("--branch", help="remote branch (default: the upstream branch)")
    fr.add_argument("--message", help="commit message")
    fr.add_argument("--testdir", help="also write the freeze record into <testdir>/provenance/freezes/")
    fr.add_argument("--no-repo-record", action="store_true", help="with --testdir, write the record there only")
    fr.set_defaults(func=_cmd_freeze)
    cli.deferred_action(sub, "predict", "score")
