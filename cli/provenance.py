"""`agentload provenance prove | verify-proof | timeline | verify`: prove files unchanged since their
commit, check such proofs without git, show a test's order of events and labels, verify a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from provenance.git import Repo
from provenance.proofcheck import verify_proof
from provenance.proofs import prove
from review.timeline import build_timeline, format_timeline
from review.verify import verify_test


def _cmd_prove(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if out is None and args.testdir:
        repo = Repo.containing(Path(args.file).resolve().parent)
        rev = (
            repo.tag_target(args.tag)
            if args.tag
            else (repo.resolve(args.commit) if args.commit else repo.last_commit_of(repo.relpath(args.file)))
        )
        out = Path(args.testdir) / "provenance" / "proofs" / f"{Path(args.file).stem}-{str(rev)[:12]}"
    folder = prove(args.file, out, tag=args.tag, commit=args.commit)
    man = json.loads((folder / "proof.json").read_text())
    print(
        f"proof of {man['path']} (SHA-256 {man['file_sha256']}) at commit {man['commit'][:12]}"
        + (f", tag {man['tag']['name']}" if man["tag"] else "")
        + f": {len(man['objects'])} objects in {folder}"
    )
    if man["worktree_sha256_at_proof"] not in (None, man["file_sha256"]):
        print(
            f"WARNING: the work-tree copy ({man['worktree_sha256_at_proof'][:16]}) differs from the committed bytes "
            "proven here"
        )
    res = verify_proof(folder)
    print(res.text().splitlines()[0])
    return 0 if res.ok else 1


def _cmd_verify_proof(args: argparse.Namespace) -> int:
    res = verify_proof(args.dir, args.file, args.runs)
    print(res.text())
    return 0 if res.ok else 1


def _repo(args: argparse.Namespace) -> Any:
    """The repository holding the registration and the freezes: --repo, else the one holding the
    test directory, else the current directory's."""
    return Repo.containing(Path(args.repo)) if getattr(args, "repo", None) else None


def _cmd_timeline(args: argparse.Namespace) -> int:
    tl = build_timeline(args.testdir, freezes=args.predictions, repo=_repo(args))
    if args.json:
        print(json.dumps(tl.to_json(), indent=2, default=str))
    else:
        print(format_timeline(tl))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    v = verify_test(
        args.testdir,
        repo=_repo(args),
        pool_tolerance_tokens=args.pool_tolerance,
        clock_slack_s=args.clock_slack,
        code_check=not args.no_code_check,
    )
    print(json.dumps(v.to_json(), indent=2, default=str) if args.json else v.text())
    return 0 if v.ok else 1


def register(cli: Any) -> None:
    """Add `agentload provenance ...`."""
    p = cli.command(
        "provenance",
        group="judge",
        help="proofs of unchanged files, a test's timeline and labels, whole-test verification",
    )

    p.set_defaults(func=None, _parser=p)
    sub = p.add_subparsers(dest="provenance_action", metavar="ACTION")

    pr = sub.add_parser("prove", help="store the raw git objects linking a file's bytes to its commit (and tag)")
    pr.add_argument("file")
    g = pr.add_mutually_exclusive_group()
    g.add_argument("--tag", help="annotated tag (a freeze tag) the chain ends in")
    g.add_argument("--commit", help="commit to prove against (default: the file's last commit)")
    pr.add_argument("--out", help="proof folder (default <repo>/provenance/proofs/<name>-<commit>)")
    pr.add_argument("--testdir", help="put the proof under <testdir>/provenance/proofs/ (verify checks it there)")
    pr.set_defaults(func=_cmd_prove)

    vp = sub.add_parser(
        "verify-proof", help="check a proof folder with no git: recompute every object id, check every link"
    )
    vp.add_argument("dir")
    vp.add_argument("--file", help="a copy of the file that must be byte-identical to the proven bytes")
    vp.add_argument(
        "--runs", nargs="*", default=[], help="run directories whose meta.json must carry the file's SHA-256"
    )
    vp.set_defaults(func=_cmd_verify_proof)

    tl = sub.add_parser(
        "timeline", help="a test's events in UTC (git, freeze records, scheduler, meta.json) and the labels they give"
    )
    tl.add_argument("testdir")
    tl.add_argument("--predictions", nargs="*", help="freeze tags or records (default: those found for the test)")
    tl.add_argument(
        "--repo", help="repository holding the registration and freezes (default: the test directory's, else .)"
    )
    tl.add_argument("--json", action="store_true")
    tl.set_defaults(func=_cmd_timeline)

    vf = sub.add_parser(
        "verify", help="verify a whole test: runs bound and complete, proofs intact, timeline consistent"
    )
    vf.add_argument("testdir")
    vf.add_argument(
        "--pool-tolerance",
        type=float,
        default=0.0,
        help="tokens a run's pool may differ from the registered (default 0)",
    )
    vf.add_argument(
        "--clock-slack", type=float, default=60.0, help="seconds of clock difference tolerated between records"
    )
    vf.add_argument(
        "--no-code-check", action="store_true", help="do not check the runs' code commit against the registration's"
    )
    vf.add_argument(
        "--repo", help="repository holding the registration and freezes (default: the test directory's, else .)"
    )
    vf.add_argument("--json", action="store_true")
    vf.set_defaults(func=_cmd_verify)
