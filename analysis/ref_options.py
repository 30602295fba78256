"""The rule and reference options that `analyze` and `test run` share, apart from the judging code.

Why apart: a command's parser is built before it runs, and `analyze` starts its figure process
(analysis/figure_process.py) before it imports the scoring (pandas and the measures, about
0.4 s); options defined beside the scoring would import it while the parser is built.
"""

from __future__ import annotations

import argparse


def refs_override(args: argparse.Namespace) -> dict[str, float] | None:
    """The references given on the command line (`--lambda-ref`, `--all-miss-rate`), if any."""
    out = {}
    if getattr(args, "lambda_ref", None):
        out["lambda_ref"] = float(args.lambda_ref)
    if getattr(args, "all_miss_rate", None):
        out["all_miss_token_rate"] = float(args.all_miss_rate)
    return out or None


def add_ref_options(p: argparse.ArgumentParser) -> None:
    """The rule and reference options shared by `analyze` and `test run`."""
    p.add_argument(
        "--rule", help="rule: a name under analysis/rulespecs or a YAML file (default: the test's, else the runs')"
    )
    p.add_argument("--lambda-ref", type=float, help="override the cell's lambda_ref in the rule (sessions/s)")
    p.add_argument("--all-miss-rate", type=float, help="override the cell's E0a all-miss token rate in the rule")
