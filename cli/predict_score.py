"""Action: `agentload predict score PRED TARGETS`: frozen predictions, read from their tag, scored
against runs or a test directory (review/score_report.py).

A module of its own (cli.commands.ACTIONS): scoring judges runs by the rule engine (pandas), which
`predict freeze` (cli/predict.py) has no use for.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from provenance.git import Repo
from review.score_report import score_frozen, summary_lines, write_report


def _cmd_score(args: argparse.Namespace) -> int:
    if not args.targets and not args.outcomes:
        raise UsageError("predict score: give run directories or a test directory, or --outcomes FILE")
    repo = None
    if args.repo:
        repo = Repo.containing(Path(args.repo))
    rep = score_frozen(args.pred, args.targets, outcome_files=args.outcomes or (), rule=args.rule, repo=repo)
    td = next(
        (Path(t) for t in args.targets if (Path(t) / "runs").is_dir() or (Path(t) / "submission.json").is_file()), None
    )
    out = Path(args.out) if args.out else ((td / "predictions") if td else Path("."))
    paths = write_report(rep, out)
    if args.json:
        print(json.dumps(rep.to_json(), indent=2, default=str))
    else:
        print("\n".join(summary_lines(rep)))
        print(f"report: {paths['markdown']}")
        print(f"json:   {paths['json']}")
    return 1 if rep.problems else 0


def register(cli: Any) -> None:
    """Fill `agentload predict score`'s parser (cli/predict.py adds it)."""
    sc = cli.action_parser("predict", "score")
    sc.add_argument("pred", help="freeze tag name, or a freeze record (.json)")
    sc.add_argument("targets", nargs="*", help="run directories or a test directory")
    sc.add_argument("--outcomes", action="append", help="outcomes data file (format agentload-outcomes), repeatable")
    sc.add_argument("--rule", help="rule spec YAML the runs are judged with (default: the registered E2 rule)")
    sc.add_argument("--out", help="report folder (default <testdir>/predictions or .)")
    sc.add_argument("--repo", help="repository holding the freeze tag (default: the test directory's, else .)")
    sc.add_argument("--json", action="store_true", help="print the JSON report")
    sc.set_defaults(func=_cmd_score)
