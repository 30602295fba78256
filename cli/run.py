"""Commands that run things: `run` (one arm x rate x seed) and `test run` (a whole paired test,
then its verdict).

`test run` is the main job: it runs every run of the test in parallel worker processes with a live
display (a rich table on a terminal, plain progress lines otherwise), then hands the run
directories to the judging side (`analysis.judge.report_runs`), which prints the verdict table and
where the report and figure are. Judging never imports this module: analysis reads run records
only, so a verdict can be recomputed on a machine that cannot run anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from analysis.forking import cpus
from analysis.judge import report_runs
from analysis.ref_options import add_ref_options, refs_override
from analysis.rules import load_rule
from analysis.theory.predict import freeze_predictions
from harness.config import load_test
from harness.errors import ConfigError, UsageError
from harness.recording.progress import TestDisplay
from harness.recording.schema import RunStatus
from prereg.registration import load_registration
from provenance.git import GitError, Repo
from runs.arms import RunResult, execute_run, references, run_name
from runs.realrun import ENGINE_DID_NOT_START, add_engine_arguments, engine_options
from runs.suite import SuiteTest, run_suite, run_test
from slurm.job_options import add_job_options
from slurm.sweep import sweep_from_args

#: What `--engine` names: the engine backend a run is driven by (runs/backend.py).
ENGINE_HELP = (
    "engine backend: sim (the engine model in virtual time; default), emulator or emulator:sglang|vllm "
    "(the engine model behind HTTP in wall time), vllm or sglang (a real engine server)"
)

DEFAULT_RESULTS = Path("results")


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _engine_options(args: argparse.Namespace, bundle: Any) -> dict[str, Any] | None:
    """Launch settings for real engines (none for the simulator)."""
    if args.engine == "sim":
        return None

    return engine_options(args, cell_ref=bundle.test.cell)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)


def add_executor_options(p: argparse.ArgumentParser) -> None:
    """Where the runs run: this machine's processes, or one SLURM job array (slurm/sweep.py)."""
    g = p.add_argument_group("executor")
    g.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="local worker processes (default), or one SLURM job array through submitit (the same records)",
    )
    add_job_options(
        p, time_default="60 minutes per task", title="scheduler jobs (--executor slurm; the options `submit` takes)"
    )


def sweep_executor(args: argparse.Namespace, out: Path, name: str) -> Any:
    """The SLURM sweep of `--executor slurm` (None for local); its job logs go under out/slurm/."""
    if getattr(args, "executor", "local") != "slurm":
        return None

    args.sweep_name = name
    return sweep_from_args(args, Path(out) / "slurm")


def one_line(text: str | None) -> str:
    """A reason on one line: a multi-line message (a config error lists its fields) joined by '; '."""
    return "; ".join(x.strip() for x in (text or "").strip().splitlines() if x.strip()) or "no reason recorded"


def engine_start_line(results: Sequence[Any]) -> str | None:
    """One closing line when runs failed because their engine did not start: how many, and the
    first one's reason (what its server log says and where that log is); None otherwise. The same
    cause fails every run of a cell, so this is what a person needs to read last."""
    failed = [r for r in results if r.status != "COMPLETED" and (r.reason or "").startswith(ENGINE_DID_NOT_START)]
    if not failed:
        return None
    first = f"{Path(failed[0].run_dir).name}: {one_line(failed[0].reason)}"
    return f"the engine did not start in {len(failed)} of {len(results)} run(s); {first}"


def _lateness(res: Any) -> str:
    ol = res.open_loop or {}
    if not ol.get("n"):
        return ""
    return (
        f"; session starts late p50 {1e3 * ol['p50_s']:.1f} ms, p99 {1e3 * ol['p99_s']:.1f} ms, max "
        f"{1e3 * ol['max_s']:.1f} ms"
    )


def registered_bundle(path: str) -> tuple[Any, dict[str, Any]]:
    """The test a registration fixes (its own configs, plans at its top rate) and the meta.json
    values of a run made from it: the binding (name, repository-relative path, SHA-256, and the
    commit that last changed the file, None when it is not committed: such a run binds nothing
    decisive) and the registered rule's name."""
    reg = load_registration(path)
    if reg.status == "INCOMPLETE":
        raise UsageError(f"{path}: status INCOMPLETE ({'; '.join(reg.status_reasons)}): it binds no run")
    rel, commit = str(path), None
    try:
        repo = Repo.containing(path)
        rel = repo.relpath(path)
        if repo.file_state(rel) == "committed":
            commit = repo.last_commit_of(rel)
    except (GitError, OSError):
        pass
    return reg.bundle(), {"registration": reg.binding(path=rel, commit=commit), "rule": str(reg.rule.get("name") or "")}


def _cmd_run(args: argparse.Namespace) -> int:
    if bool(args.config) == bool(args.registration):
        raise UsageError("run: give the test as --config TEST.yaml or as --registration REG.yaml (one of them)")
    extra = None
    if args.registration:
        bundle, extra = registered_bundle(args.registration)
    else:
        bundle = load_test(args.config)
    out = (
        Path(args.out)
        if args.out
        else DEFAULT_RESULTS / "runs" / f"{bundle.test.name}-{_stamp()}" / run_name(args.arm, args.rate, args.seed)
    )
    res = execute_run(
        bundle,
        args.arm,
        args.rate,
        args.seed,
        args.engine,
        out,
        options=_engine_options(args, bundle),
        extra_meta=extra,
    )
    print(f"{res.status}: {res.run_dir} ({res.wall_s:.1f} s wall, {res.plan_time:.0f} s plan time{_lateness(res)})")
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if res.status != RunStatus.COMPLETED:
        print(res.reason if args.debug else one_line(res.reason), file=sys.stderr)
        return 1
    return 0


def _cmd_test_run(args: argparse.Namespace) -> int:
    if len(args.test) > 1:
        return run_suite_command(args)
    args.test = args.test[0]
    bundle = load_test(args.test)
    out = Path(args.out) if args.out else DEFAULT_RESULTS / f"{bundle.test.name}-{args.engine}-{_stamp()}"
    jobs = args.jobs or os.cpu_count() or 1
    n = len(bundle.arms) * len(bundle.test.rates) * len(bundle.test.seeds)
    print(
        f"{bundle.test.name}: {n} runs ({', '.join(bundle.arms)} x rates {bundle.test.rates} x seeds "
        f"{bundle.test.seeds}), engine {args.engine}, {jobs} worker(s), output {out}",
        flush=True,
    )

    # a bad rule fails before any run; a rule file the test names is found beside the test (rule_path)
    spec = load_rule(args.rule or bundle.rule_path or bundle.test.rule, bundle.test.rule_params)
    if bundle.test.predictions == "freeze":
        freeze_test_predictions(bundle, spec, out)
    t0 = time.monotonic()
    sweep = sweep_executor(args, out, bundle.test.name)
    display = TestDisplay(live=None if not args.plain else False) if sweep is None else None
    results = run_test(
        bundle.path or args.test,
        args.engine,
        out,
        jobs=jobs,
        display=display,
        options=_engine_options(args, bundle),
        rule=args.rule,
        executor=sweep,
    )
    wall = time.monotonic() - t0
    if sweep is not None:
        print(f"SLURM accounting of the array: {sweep.export_accounting(out / 'provenance')}", flush=True)
    failed = [r for r in results if r.status != RunStatus.COMPLETED]
    print(f"{len(results)} runs in {wall:.0f} s wall; {len(failed)} not completed", flush=True)
    (out / "wall.json").write_text(f'{{"runs": {len(results)}, "wall_s": {wall:.2f}, "jobs": {jobs}}}\n')
    if len(failed) < len(results):
        code = report_runs(
            [r.run_dir for r in results],
            out,
            test_path=str(bundle.path or args.test),
            rule=args.rule,
            refs=refs_override(args),
            predictions=str(out / "predictions.json") if bundle.test.predictions == "freeze" else None,
            figures=getattr(args, "figures", None),  # forked by cli.main before this module was imported
            workers=cpus(),  # the pool is done: forks score the runs where no thread is left (analysis.forking)
        )
    else:
        print("no run completed: no verdict", flush=True)
        code = 1
    # The end of the output is what needs reading: what went wrong, one line per run.
    warned = [r for r in results if r.warnings]
    if warned:
        print(f"{len(warned)} run(s) with warnings:", file=sys.stderr)
        for r in warned:
            print(f"  {Path(r.run_dir).name}: {'; '.join(r.warnings)}", file=sys.stderr)
    if failed:
        print(
            f"{len(failed)} run(s) not completed{'' if args.debug else ' (tracebacks with --debug)'}:", file=sys.stderr
        )
        for r in failed:
            print(f"  {Path(r.run_dir).name}: {r.status}: {one_line(r.reason)}", file=sys.stderr)
            if args.debug and r.detail:
                print(r.detail.rstrip(), file=sys.stderr)
    start = engine_start_line(results)
    if start:
        print(start, file=sys.stderr)
    sys.stderr.flush()
    return code


def freeze_test_predictions(bundle: Any, spec: Any, out: Path) -> Path:
    """Model F's predictions for the test's plans, written to <out>/predictions.json before any
    run exists (the verdict reads this file; it never recomputes a prediction)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "predictions.json"
    if path.exists():
        raise ConfigError(f"{path} already exists: a frozen prediction is never overwritten; choose a fresh --out")
    content = freeze_predictions(bundle, spec, lambda_ref=references(bundle)["lambda_ref"])
    path.write_bytes(orjson.dumps(content, option=orjson.OPT_INDENT_2))
    print(f"predictions frozen before the runs: {path}", flush=True)
    return path


def register(cli: Any) -> None:
    """Add `run` and `test run` to the agentload command."""
    p = cli.command("run", group="execute", help="drive one arm x rate x seed of a test into a run directory")
    p.add_argument("--config", help="test YAML (names the cell, workload, protocol and arms)")
    p.add_argument(
        "--registration",
        help="a FILLED registration instead of --config: its configs and plans, and the run bound to it",
    )
    p.add_argument("--arm", required=True, help="arm name, e.g. BURST")
    p.add_argument("--rate", required=True, type=float, help="arrival rate in multiples of the cell's lambda_ref")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--engine", default="sim", help=ENGINE_HELP)
    p.add_argument("--out", help="run directory (default: results/runs/<test>-<time>/<arm>-r<rate>-s<seed>)")
    p.add_argument("--debug", action="store_true", help="show a failed run's whole reason")
    _add_engine_options(p)
    p.set_defaults(func=_cmd_run)

    t = cli.command("test", group="execute", help="run a whole test (every arm x rate x seed) and score it")
    sub = t.add_subparsers(dest="test_command", metavar="ACTION")
    t.set_defaults(func=None, _parser=t)
    tr = sub.add_parser(
        "run",
        help="run every arm x rate x seed of a test, then print its verdict",
        description="Run every arm x rate x seed of a test, then score it. Several tests (e.g. "
        "configs/tests/*.yaml) share one pool of --jobs workers; each is scored as soon as its own runs are "
        "done, into <out>/<test name>/.",
    )
    tr.add_argument(
        "test", nargs="+", help="test YAML, e.g. configs/tests/e2-sglang-300k.yaml (several: one pool for all)"
    )
    tr.add_argument("--engine", default="sim", help=ENGINE_HELP)
    tr.add_argument("--jobs", type=int, default=None, help="parallel worker processes (default: CPU count)")
    tr.add_argument(
        "--out",
        help="output folder (default: results/<test>-<engine>-<time>; several tests: results/tests-<engine>-<time>/"
        "<test>)",
    )
    tr.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    tr.add_argument(
        "--simulate-each",
        action="store_true",
        help="several tests, --engine sim: play every run, even one whose inputs (cell, workload, protocol, "
        "arm, rate, seed, references) are another test's run's; by default that run gets a copy of the other's "
        "records, and its meta.json says so (shared_simulation)",
    )
    tr.add_argument("--debug", action="store_true", help="show the traceback of each run that raised")
    add_ref_options(tr)
    _add_engine_options(tr)
    add_executor_options(tr)
    tr.set_defaults(func=_cmd_test_run)


# -------------------------------------------------------------------------------------------
# `agentload test run A.yaml B.yaml ...`: several tests in one worker pool (runs/suite.py)
# -------------------------------------------------------------------------------------------
def run_suite_command(args: argparse.Namespace) -> int:
    """Run the tests named in args.test (two or more); the exit status is the worst of theirs."""
    single = [
        opt
        for opt, given in (
            ("--rule", args.rule),
            ("--lambda-ref/--all-miss-rate", refs_override(args)),
            ("--executor slurm", getattr(args, "executor", "local") == "slurm"),
        )
        if given
    ]
    if single:
        raise UsageError(
            f"test run: {', '.join(single)} applies to one test; run those tests one at a time "
            f"(agentload test run TEST.yaml {single[0].split('/')[0]} ...)"
        )
    bundles = [load_test(p) for p in args.test]
    specs = [
        load_rule(b.rule_path or b.test.rule, b.test.rule_params) for b in bundles
    ]  # a bad rule fails before any run
    out = Path(args.out) if args.out else DEFAULT_RESULTS / f"tests-{args.engine}-{_stamp()}"
    tests = [SuiteTest(b, out / b.test.name, _engine_options(args, b)) for b in bundles]
    n = sum(len(b.arms) * len(b.test.rates) * len(b.test.seeds) for b in bundles)
    jobs = args.jobs or os.cpu_count() or 1
    print(
        f"{len(tests)} tests, {n} runs, engine {args.engine}, {jobs} worker(s) for all of them, output {out}",
        flush=True,
    )
    t0 = time.monotonic()
    codes: dict[str, int] = {}

    def run_done(t: SuiteTest, res: RunResult, done: int, total: int) -> None:
        status = res.status if res.status != RunStatus.COMPLETED else f"{res.wall_s:.0f} s"
        if res.shared_from:
            status = f"the simulation of {Path(res.shared_from).parent.name}/{Path(res.shared_from).name}"
        print(f"[{done}/{total}] {t.bundle.test.name}/{Path(res.run_dir).name}: {status}", flush=True)

    def test_done(t: SuiteTest) -> None:
        b = t.bundle
        failed = [r for r in t.results if r.status != RunStatus.COMPLETED]
        (t.out / "wall.json").write_text(
            f'{{"runs": {len(t.results)}, "wall_s": {t.wall_s:.2f}, "jobs": {jobs}, "suite": true}}\n'
        )
        print(f"== {b.test.name}: {len(t.results)} runs, {len(failed)} not completed", flush=True)
        for r in failed:
            print(f"  {Path(r.run_dir).name}: {r.status}: {one_line(r.reason)}", file=sys.stderr)
        if len(failed) == len(t.results):
            print(f"{b.test.name}: no run completed: no verdict", flush=True)
            codes[b.test.name] = 1
            return
        codes[b.test.name] = report_runs(
            [r.run_dir for r in t.results],
            t.out,
            test_path=str(b.path),
            rule=None,
            refs=None,
            predictions=str(t.out / "predictions.json") if b.test.predictions == "freeze" else None,
            figures=getattr(args, "figures", None),
        )

    for t, spec in zip(tests, specs):  # frozen before any run of any test exists
        if t.bundle.test.predictions == "freeze":
            freeze_test_predictions(t.bundle, spec, t.out)
    run_suite(tests, args.engine, jobs=jobs, on_run_done=run_done, on_test_done=test_done, share=not args.simulate_each)
    wall = time.monotonic() - t0
    shared = sum(1 for t in tests for r in t.results if r.shared_from)
    (out / "wall.json").write_text(
        f'{{"tests": {len(tests)}, "runs": {n}, "shared": {shared}, "wall_s": {wall:.2f}, "jobs": {jobs}}}\n'
    )
    played = f" ({shared} of them another test's identical simulation, not played again)" if shared else ""
    print(f"\n{len(tests)} tests, {n} runs{played} in {wall:.0f} s wall:", flush=True)
    for t in tests:
        print(f"  {t.bundle.test.name:<24} exit {codes.get(t.bundle.test.name, 1)}  {t.out}", flush=True)
    start = engine_start_line([r for t in tests for r in t.results])
    if start:
        print(start, file=sys.stderr, flush=True)
    return max(codes.values(), default=1)
