"""Commands that run things: `run` (one arm x rate x seed) and `test run` (a whole paired test,
then its verdict).

`test run` is the main job: it runs every run of the test in parallel worker processes with a live
display (a rich table on a terminal, plain progress lines otherwise), then hands the run
directories to the judging side (`analysis.cli.report_runs`), which prints the verdict table and
where the report and figure are. Judging never imports this module: analysis reads run records
only, so a verdict can be recomputed on a machine that cannot run anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from analysis.cli import add_ref_options, refs_override, report_runs

DEFAULT_RESULTS = Path("results")


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _engine_options(args: argparse.Namespace, bundle: Any) -> dict[str, Any] | None:
    """Launch settings for real engines (none for the simulator)."""
    if args.engine == "sim":
        return None
    from harness.protocols.realrun import engine_options

    return engine_options(args, cell_ref=bundle.test.cell)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    try:
        from harness.protocols.realrun import add_engine_arguments
    except ImportError:  # real-engine support not importable: the simulator still works
        return
    add_engine_arguments(p)


def one_line(text: str | None) -> str:
    """A reason on one line: a multi-line message (a config error lists its fields) joined by '; '."""
    return "; ".join(x.strip() for x in (text or "").strip().splitlines() if x.strip()) or "no reason recorded"


def _lateness(res: Any) -> str:
    ol = res.open_loop or {}
    if not ol.get("n"):
        return ""
    return f"; session starts late p50 {1e3 * ol['p50_s']:.1f} ms, p99 {1e3 * ol['p99_s']:.1f} ms, max {1e3 * ol['max_s']:.1f} ms"


def registered_bundle(path: str) -> tuple[Any, dict[str, Any]]:
    """The test a registration fixes (its own configs, plans at its top rate) and the meta.json
    values of a run made from it: the binding (name, repository-relative path, SHA-256, and the
    commit that last changed the file, None when it is not committed: such a run binds nothing
    decisive) and the registered rule's name."""
    from prereg.registration import load_registration

    reg = load_registration(path)
    if reg.status == "INCOMPLETE":
        from harness.cli import CLIError

        raise CLIError(f"{path}: status INCOMPLETE ({'; '.join(reg.status_reasons)}): it binds no run")
    rel, commit = str(path), None
    try:
        from provenance.git import GitError, Repo

        repo = Repo.containing(path)
        rel = repo.relpath(path)
        if repo.file_state(rel) == "committed":
            commit = repo.last_commit_of(rel)
    except (GitError, OSError):
        pass
    return reg.bundle(), {"registration": reg.binding(path=rel, commit=commit), "rule": str(reg.rule.get("name") or "")}


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.cli import CLIError
    from harness.config import load_test
    from harness.protocols.arms import execute_run, run_name

    if bool(args.config) == bool(args.registration):
        raise CLIError("run: give the test as --config TEST.yaml or as --registration REG.yaml (one of them)")
    extra = None
    if args.registration:
        bundle, extra = registered_bundle(args.registration)
    else:
        bundle = load_test(args.config)
    out = Path(args.out) if args.out else DEFAULT_RESULTS / "runs" / f"{bundle.test.name}-{_stamp()}" / run_name(args.arm, args.rate, args.seed)
    res = execute_run(bundle, args.arm, args.rate, args.seed, args.engine, out, options=_engine_options(args, bundle), extra_meta=extra)
    print(f"{res.status}: {res.run_dir} ({res.wall_s:.1f} s wall, {res.plan_time:.0f} s plan time{_lateness(res)})")
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if res.status != "COMPLETED":
        print(res.reason if args.debug else one_line(res.reason), file=sys.stderr)
        return 1
    return 0


def _cmd_test_run(args: argparse.Namespace) -> int:
    from harness.config import load_test
    from harness.protocols.arms import run_test
    from harness.recording.progress import TestDisplay

    bundle = load_test(args.test)
    out = Path(args.out) if args.out else DEFAULT_RESULTS / f"{bundle.test.name}-{args.engine}-{_stamp()}"
    jobs = args.jobs or os.cpu_count() or 1
    n = len(bundle.arms) * len(bundle.test.rates) * len(bundle.test.seeds)
    print(f"{bundle.test.name}: {n} runs ({', '.join(bundle.arms)} x rates {bundle.test.rates} x seeds {bundle.test.seeds}), "
          f"engine {args.engine}, {jobs} worker(s), output {out}", flush=True)  # fmt: skip
    t0 = time.monotonic()
    display = TestDisplay(live=None if not args.plain else False)
    results = run_test(bundle.path or args.test, args.engine, out, jobs=jobs, display=display, options=_engine_options(args, bundle), rule=args.rule)
    wall = time.monotonic() - t0
    failed = [r for r in results if r.status != "COMPLETED"]
    print(f"{len(results)} runs in {wall:.0f} s wall; {len(failed)} not completed", flush=True)
    (out / "wall.json").write_text(f'{{"runs": {len(results)}, "wall_s": {wall:.2f}, "jobs": {jobs}}}\n')
    if len(failed) < len(results):
        code = report_runs([r.run_dir for r in results], out, test_path=str(bundle.path or args.test), rule=args.rule, refs=refs_override(args))
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
        print(f"{len(failed)} run(s) not completed{'' if args.debug else ' (tracebacks with --debug)'}:", file=sys.stderr)
        for r in failed:
            print(f"  {Path(r.run_dir).name}: {r.status}: {one_line(r.reason)}", file=sys.stderr)
            if args.debug and r.detail:
                print(r.detail.rstrip(), file=sys.stderr)
    sys.stderr.flush()
    return code


def register(cli: Any) -> None:
    """Add `run` and `test run` to the agentload command."""
    p = cli.command("run", group="execute", help="drive one arm x rate x seed of a test into a run directory")
    p.add_argument("--config", help="test YAML (names the cell, workload, protocol and arms)")
    p.add_argument("--registration", help="a FILLED registration instead of --config: its configs and plans, and the run bound to it")
    p.add_argument("--arm", required=True, help="arm name, e.g. BURST")
    p.add_argument("--rate", required=True, type=float, help="arrival rate in multiples of the cell's lambda_ref")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--engine", default="sim", help="engine backend (default: sim)")
    p.add_argument("--out", help="run directory (default: results/runs/<test>-<time>/<arm>-r<rate>-s<seed>)")
    p.add_argument("--debug", action="store_true", help="show a failed run's whole reason")
    _add_engine_options(p)
    p.set_defaults(func=_cmd_run)

    t = cli.command("test", group="execute", help="run a whole test (every arm x rate x seed) and score it")
    sub = t.add_subparsers(dest="test_command", metavar="ACTION")
    t.set_defaults(func=None, _parser=t)
    tr = sub.add_parser("run", help="run every arm x rate x seed of a test, then print its verdict")
    tr.add_argument("test", help="test YAML, e.g. configs/tests/e2-sglang-300k.yaml")
    tr.add_argument("--engine", default="sim", help="engine backend (default: sim)")
    tr.add_argument("--jobs", type=int, default=None, help="parallel worker processes (default: CPU count)")
    tr.add_argument("--out", help="output folder (default: results/<test>-<engine>-<time>)")
    tr.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    tr.add_argument("--debug", action="store_true", help="show the traceback of each run that raised")
    add_ref_options(tr)
    _add_engine_options(tr)
    tr.set_defaults(func=_cmd_test_run)
