"""`agentload evidence pack TESTDIR --out evidence/<test>/ | check BUNDLE`: a registered test's
evidence copied into the repository, and checked from the copy alone (docs/evidence.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from provenance.git import Repo
from review.evidence import BUNDLE_BUDGET_BYTES, pack
from review.evidence_check import check_bundle


def _cmd_pack(args: argparse.Namespace) -> int:
    note = Path(args.note).read_text() if args.note else None
    repo = Repo.containing(Path(args.repo)) if args.repo else None
    res = pack(args.testdir, args.out, repo=repo, note=note, budget_bytes=int(args.budget_mb * 1e6))
    print(res.text())
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    res = check_bundle(args.bundle)
    if args.json:
        print(json.dumps({"bundle": str(res.bundle), "ok": res.ok, "checks": res.checks, "notes": res.notes}, indent=2))
    else:
        print(res.text())
    return 0 if res.ok else 1


def register(cli: Any) -> None:
    """Add `agentload evidence pack | check`."""
    p = cli.command(
        "evidence",
        group="judge",
        help="pack a registered test's evidence for the repository; check a bundle with no engine, cluster or git",
    )
    p.set_defaults(func=None, _parser=p)
    sub = p.add_subparsers(dest="evidence_action", metavar="ACTION")
    pk = sub.add_parser("pack", help="copy what a registered test's verdict and provenance depend on into a bundle")
    pk.add_argument("testdir", help="the test directory (submission.json, runs/, provenance/, the registered verdict)")
    pk.add_argument("--out", required=True, help="the bundle folder to write (new or empty), e.g. evidence/<test>")
    pk.add_argument(
        "--repo", help="the repository holding the registration commit and freeze tags (default: the test directory's)"
    )
    pk.add_argument(
        "--note", help="a Markdown file whose text goes into the bundle's README.md (what the test is, and is not)"
    )
    pk.add_argument(
        "--budget-mb", type=float, default=BUNDLE_BUDGET_BYTES / 1e6, help="warn when the bundle weighs more (MB)"
    )
    pk.set_defaults(func=_cmd_pack)
    ck = sub.add_parser("check", help="check a bundle: file hashes, the verdict recomputed, proofs, the timeline")
    ck.add_argument("bundle", help="an evidence bundle folder (bundle.json)")
    ck.add_argument("--json", action="store_true")
    ck.set_defaults(func=_cmd_check)
