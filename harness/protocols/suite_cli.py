"""`agentload test run A.yaml B.yaml ...`: several tests in one worker pool (harness/protocols/suite.py).

Each test gets what `test run` of it alone gives, in <out>/<test name>/: its runs, wall.json,
its frozen predictions when the test freezes them, verdict.json, report.md and figure.png. The
options that only make sense for one test (a rule or references overriding the test's own, a
SLURM array) are refused with a note on how to run such tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness.protocols.arms import RunResult
from harness.protocols.cli import DEFAULT_RESULTS, _engine_options, _stamp, freeze_test_predictions, one_line
from harness.protocols.suite import SuiteTest, run_suite


def run_suite_command(args: argparse.Namespace) -> int:
    """Run the tests named in args.test (two or more); the exit status is the worst of theirs."""
    from analysis.cli import refs_override, report_runs
    from analysis.rules import load_rule
    from harness.cli import CLIError
    from harness.config import load_test

    single = [opt for opt, given in (("--rule", args.rule), ("--lambda-ref/--all-miss-rate", refs_override(args)),
                                     ("--executor slurm", getattr(args, "executor", "local") == "slurm")) if given]  # fmt: skip
    if single:
        raise CLIError(f"test run: {', '.join(single)} applies to one test; run those tests one at a time "
                       f"(agentload test run TEST.yaml {single[0].split('/')[0]} ...)")  # fmt: skip
    bundles = [load_test(p) for p in args.test]
    specs = [load_rule(b.rule_path or b.test.rule, b.test.rule_params) for b in bundles]  # a bad rule fails before any run
    out = Path(args.out) if args.out else DEFAULT_RESULTS / f"tests-{args.engine}-{_stamp()}"
    tests = [SuiteTest(b, out / b.test.name, _engine_options(args, b)) for b in bundles]
    n = sum(len(b.arms) * len(b.test.rates) * len(b.test.seeds) for b in bundles)
    jobs = args.jobs or os.cpu_count() or 1
    print(f"{len(tests)} tests, {n} runs, engine {args.engine}, {jobs} worker(s) for all of them, output {out}", flush=True)
    t0 = time.monotonic()
    codes: dict[str, int] = {}

    def run_done(t: SuiteTest, res: RunResult, done: int, total: int) -> None:
        status = res.status if res.status != "COMPLETED" else f"{res.wall_s:.0f} s"
        print(f"[{done}/{total}] {t.bundle.test.name}/{Path(res.run_dir).name}: {status}", flush=True)

    def test_done(t: SuiteTest) -> None:
        b = t.bundle
        failed = [r for r in t.results if r.status != "COMPLETED"]
        (t.out / "wall.json").write_text(f'{{"runs": {len(t.results)}, "wall_s": {t.wall_s:.2f}, "jobs": {jobs}, "suite": true}}\n')
        print(f"== {b.test.name}: {len(t.results)} runs, {len(failed)} not completed", flush=True)
        for r in failed:
            print(f"  {Path(r.run_dir).name}: {r.status}: {one_line(r.reason)}", file=sys.stderr)
        if len(failed) == len(t.results):
            print(f"{b.test.name}: no run completed: no verdict", flush=True)
            codes[b.test.name] = 1
            return
        codes[b.test.name] = report_runs([r.run_dir for r in t.results], t.out, test_path=str(b.path), rule=None, refs=None,
                                         predictions=str(t.out / "predictions.json") if b.test.predictions == "freeze" else None)  # fmt: skip

    for t, spec in zip(tests, specs):  # frozen before any run of any test exists
        if t.bundle.test.predictions == "freeze":
            freeze_test_predictions(t.bundle, spec, t.out)
    run_suite(tests, args.engine, jobs=jobs, on_run_done=run_done, on_test_done=test_done)
    wall = time.monotonic() - t0
    (out / "wall.json").write_text(f'{{"tests": {len(tests)}, "runs": {n}, "wall_s": {wall:.2f}, "jobs": {jobs}}}\n')
    print(f"\n{len(tests)} tests, {n} runs in {wall:.0f} s wall:", flush=True)
    for t in tests:
        print(f"  {t.bundle.test.name:<24} exit {codes.get(t.bundle.test.name, 1)}  {t.out}", flush=True)
    return max(codes.values(), default=1)
