"""Run directories and a test -> the verdict files: what `analyze` and the end of `test run` share.

`report_runs` scores run directories with the rule the test (or the runs) name and writes
verdict.json, report.md and figure.png. It reads run records and test configs only; it never
imports a driver, a runner or a server adapter, so the judging half can be re-run by a reviewer with
nothing that executes runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from analysis.figure_process import FigureProcess
from analysis.paired import is_paired
from analysis.predictions import Predictions
from analysis.reports import write_report
from analysis.rules import load_rule
from analysis.staged_analysis import analyze_staged
from harness.config import load_test


def _first_meta(run_dirs: Sequence[str]) -> dict[str, Any]:
    for d in run_dirs:
        try:
            return dict(orjson.loads((Path(d) / "meta.json").read_bytes()))
        except (OSError, ValueError):
            continue
    return {}


def resolve_predictions(value: str | None, out_dir: Path, test_path: str | None) -> Path | None:
    """The frozen prediction file a verdict reads: an explicit path, or for a test that freezes its
    own ('freeze'), the predictions.json its `test run` wrote beside the runs."""
    if not value:
        return None
    if value == "freeze":
        for cand in (out_dir / "predictions.json", out_dir.parent / "predictions.json"):
            if cand.is_file():
                return cand
        raise FileNotFoundError(
            f"the test freezes its predictions, but no predictions.json is in {out_dir} or its parent; "
            "pass --predictions FILE"
        )
    p = Path(value)
    if not p.is_absolute() and test_path and not p.is_file():
        p = Path(test_path).parent / value
    return p


def registration_binding(ref: str, test_path: Path) -> dict[str, str]:
    """What a staged rule's `run.bound` compares with when the test names a registration: the
    SHA-256 of the registration file (a path as given, else beside the test); a run counts only if
    its meta.json binds it to those bytes."""
    p = Path(ref)
    if not p.is_file() and not p.is_absolute():
        p = test_path.parent / ref
    try:
        return {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    except OSError as exc:
        raise FileNotFoundError(
            f"{test_path}: registration: {ref!r} cannot be read ({exc}); "
            "expected the registration file the runs are bound to"
        ) from None


def report_runs(
    run_dirs: Sequence[str],
    out_dir: Path,
    *,
    test_path: str | None,
    rule: str | None,
    refs: dict[str, float] | None,
    predictions: str | None = None,
    figures: FigureProcess | None = None,
    workers: int = 1,
) -> int:
    """Score run directories, write verdict JSON + Markdown + figure to `out_dir`, print the tables.

    The rule is `rule` if given, else the test's, else the one the runs recorded. `figures`: a
    started figure process to draw the figure in (analysis/figure_process.py); `workers`:
    processes that score the runs (analysis.forking). Returns the exit status (`exit_status`)."""
    arm_names = rates = seeds = None
    name = cell = None
    expect_registration = None
    rule_params = None
    pred_value = predictions
    if test_path:
        b = load_test(test_path)
        rates, seeds, name = list(b.test.rates), list(b.test.seeds), b.test.name
        arm_names = [a.name for a in b.arms.values()]
        cell = b.cell.name
        rule = rule or (str(b.rule_path) if b.rule_path else b.test.rule)  # the test's own rule unless overridden
        rule_params = b.test.rule_params
        pred_value = pred_value or b.test.predictions
        if b.test.registration:
            expect_registration = registration_binding(b.test.registration, Path(test_path))
    if not test_path:  # no test given: the rule and overrides the runs themselves recorded
        m = _first_meta(run_dirs)
        rule = rule or m.get("rule") or None
        rule_params = m.get("rule_params") if rule == m.get("rule") else None
    spec = load_rule(rule, rule_params)
    pp = resolve_predictions(pred_value, Path(out_dir), test_path)
    preds = Predictions.load(pp) if pp else None
    verdict, analyzed = analyze_staged(
        run_dirs,
        spec,
        arms=arm_names,
        rates=rates,
        seeds=seeds,
        refs_override=refs,
        predictions=preds,
        test_name=name,
        expect_cell=cell,
        expect_registration=expect_registration,
        workers=workers,
    )
    paths, md = write_report(verdict, analyzed, out_dir, figures=figures)
    print()
    print(md)
    status = exit_status(spec, verdict)
    print()
    print(f"verdict: {paths['verdict']}")
    print(f"report:  {paths['report']}")
    print(f"figure:  {paths['figure']}")
    return status


def exit_status(spec: Mapping[str, Any], verdict: Mapping[str, Any]) -> int:
    """0 when the paired test E2 PASSES; for the other families 0 when the verdict is decided (any
    outcome but INCOMPLETE), since their outcomes are findings either way; else 1."""
    if is_paired(spec):
        return 0 if verdict["verdict"] == "PASS" else 1
    return 0 if verdict["verdict"] != "INCOMPLETE" else 1
