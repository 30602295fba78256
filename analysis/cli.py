"""Commands: `run` (one arm x rate x seed), `test run` (a whole paired test, then its verdict) and
`analyze` (a verdict from existing run directories).

`test run` is the main job: it runs every run of the test in parallel worker processes with a live
display (a rich table on a terminal, plain progress lines otherwise), then analyses the runs with
the registered rule and prints the verdict table and where the report and figure are.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

DEFAULT_RESULTS = Path("results")


# ---------------------------------------------------------------------------------------------
# progress display for a test
# ---------------------------------------------------------------------------------------------
class TestDisplay:
    """Per-run plan time, backlog and recent hit fraction; rich on a TTY, log lines elsewhere."""

    __test__ = False

    def __init__(self, stream: Any = None, live: bool | None = None, log_every: float = 15.0) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.log_every = log_every
        self.rows: dict[str, dict[str, Any]] = {}
        self.duration = 1.0
        self._live: Any = None
        self._last = 0.0
        self._t0 = time.monotonic()

    def start(self, keys: Sequence[str], duration: float) -> None:
        self.duration = duration
        self.rows = {k: {"t": 0.0, "in_system": None, "hit": None, "status": "queued"} for k in keys}
        self._t0 = time.monotonic()
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self._print(f"running {len(keys)} runs of {duration:.0f} s plan time each")

    def update(self, msg: dict[str, Any]) -> None:
        row = self.rows.setdefault(msg["key"], {})
        row.update({"t": msg["t"], "in_system": msg.get("in_system"), "held": msg.get("held"), "status": "running"})
        if msg.get("hit") is not None:
            row["hit"] = msg["hit"]
        self._refresh()

    def finished(self, key: str, res: Any) -> None:
        row = self.rows.setdefault(key, {})
        row.update({"status": res.status, "t": res.plan_time if res.plan_time == res.plan_time else row.get("t", 0.0), "wall": res.wall_s})
        if not self.live:
            extra = f" ({res.reason.splitlines()[0]})" if res.status != "COMPLETED" and res.reason else ""
            self._print(f"{key}: {res.status} in {res.wall_s:.0f} s{extra}")
        self._refresh(force=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._table(), refresh=True)
            self._live.stop()
            self._live = None
        else:
            self._print(self._summary())

    def _summary(self) -> str:
        done = sum(1 for r in self.rows.values() if r.get("status") in ("COMPLETED", "FAILED", "INTERRUPTED"))
        frac = sum(min(r.get("t", 0.0), self.duration) for r in self.rows.values()) / (self.duration * max(1, len(self.rows)))
        return f"[{time.monotonic() - self._t0:.0f} s] {done}/{len(self.rows)} runs done, {100 * frac:.0f}% of plan time"

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._live is not None:
            self._live.update(self._table())
        elif force or now - self._last >= self.log_every:
            self._last = now
            if not force:
                self._print(self._summary())

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _table(self) -> Any:
        from rich.table import Table

        t = Table(title=self._summary(), expand=False)
        for col, j in (("run", "left"), ("plan time", "right"), ("in system", "right"), ("held", "right"), ("hit (last 50 s)", "right"), ("status", "left")):
            t.add_column(col, justify=j)  # type: ignore[arg-type]
        for k, r in self.rows.items():
            pct = 100 * min(r.get("t", 0.0), self.duration) / self.duration
            hit = r.get("hit")
            t.add_row(
                k, f"{r.get('t', 0.0):.0f} s ({pct:.0f}%)", "-" if r.get("in_system") is None else str(r["in_system"]),
                "-" if not r.get("held") else str(r["held"]), "-" if hit is None else f"{hit:.2f}", str(r.get("status", "")),
            )  # fmt: skip
        return t


# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
def _refs_override(args: argparse.Namespace) -> dict[str, float] | None:
    out = {}
    if getattr(args, "lambda_ref", None):
        out["lambda_ref"] = float(args.lambda_ref)
    if getattr(args, "all_miss_rate", None):
        out["all_miss_token_rate"] = float(args.all_miss_rate)
    return out or None


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.config import load_test
    from harness.runner import execute_run, run_name

    bundle = load_test(args.config)
    out = Path(args.out) if args.out else DEFAULT_RESULTS / "runs" / f"{bundle.test.name}-{_stamp()}" / run_name(args.arm, args.rate, args.seed)
    res = execute_run(bundle, args.arm, args.rate, args.seed, args.engine, out, options=_engine_options(args, bundle))
    print(f"{res.status}: {res.run_dir} ({res.wall_s:.1f} s wall, {res.plan_time:.0f} s plan time)")
    if res.status != "COMPLETED":
        print(res.reason or "", file=sys.stderr)
        return 1
    return 0


def _engine_options(args: argparse.Namespace, bundle: Any) -> dict[str, Any] | None:
    """Launch settings for real engines (none for the simulator)."""
    if args.engine == "sim":
        return None
    from harness.realrun import engine_options

    return engine_options(args, cell_ref=bundle.test.cell)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    try:
        from harness.realrun import add_engine_arguments
    except ImportError:  # real-engine support not importable: the simulator still works
        return
    add_engine_arguments(p)


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _report(run_dirs: Sequence[str], out_dir: Path, *, test_path: str | None, rule: str | None, refs: dict[str, float] | None) -> int:
    from analysis.report import analyze, markdown_table, runs_table, write_report

    arms = rates = seeds = None
    name = None
    if test_path:
        from harness.config import load_test

        b = load_test(test_path)
        arms, rates, seeds, name = list(b.arms), list(b.test.rates), list(b.test.seeds), b.test.name
    verdict, analyzed = analyze(run_dirs, rule=rule, arms=arms, rates=rates, seeds=seeds, refs_override=refs, test_name=name)
    paths = write_report(verdict, analyzed, out_dir)
    print()
    print(markdown_table(verdict))
    print()
    print(runs_table(verdict))
    print()
    print(f"verdict: {paths['verdict']}")
    print(f"report:  {paths['report']}")
    print(f"figure:  {paths['figure']}")
    return 0 if verdict["verdict"] == "PASS" else 1


def _cmd_test_run(args: argparse.Namespace) -> int:
    from harness.config import load_test
    from harness.runner import run_test

    bundle = load_test(args.test)
    out = Path(args.out) if args.out else DEFAULT_RESULTS / f"{bundle.test.name}-{args.engine}-{_stamp()}"
    jobs = args.jobs or os.cpu_count() or 1
    n = len(bundle.arms) * len(bundle.test.rates) * len(bundle.test.seeds)
    print(f"{bundle.test.name}: {n} runs ({', '.join(bundle.arms)} x rates {bundle.test.rates} x seeds {bundle.test.seeds}), "
          f"engine {args.engine}, {jobs} worker(s), output {out}", flush=True)  # fmt: skip
    t0 = time.monotonic()
    display = TestDisplay(live=None if not args.plain else False)
    results = run_test(bundle.path or args.test, args.engine, out, jobs=jobs, display=display, options=_engine_options(args, bundle))
    wall = time.monotonic() - t0
    failed = [r for r in results if r.status != "COMPLETED"]
    print(f"{len(results)} runs in {wall:.0f} s wall; {len(failed)} not completed", flush=True)
    for r in failed:
        print(f"  {Path(r.run_dir).name}: {r.status}: {(r.reason or '').strip()}", file=sys.stderr)
    (out / "wall.json").write_text(f'{{"runs": {len(results)}, "wall_s": {wall:.2f}, "jobs": {jobs}}}\n')
    return _report([r.run_dir for r in results], out, test_path=str(bundle.path or args.test), rule=args.rule, refs=_refs_override(args))


def _cmd_analyze(args: argparse.Namespace) -> int:
    dirs: list[str] = []
    for d in args.runs:
        p = Path(d)
        if (p / "meta.json").exists():
            dirs.append(str(p))
        else:  # a test output folder: every run directory under it
            dirs += sorted(str(x.parent) for x in p.glob("*/meta.json"))
    if not dirs:
        print("no run directories found", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(os.path.commonpath(dirs)) / "analysis"
    return _report(dirs, out, test_path=args.test, rule=args.rule, refs=_refs_override(args))


def _add_ref_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rule", help="rule spec YAML (default: the registered E2 rule)")
    p.add_argument("--lambda-ref", type=float, help="override the cell's lambda_ref in the rule (sessions/s)")
    p.add_argument("--all-miss-rate", type=float, help="override the cell's E0a all-miss token rate in the rule")


def register(cli: Any) -> None:
    """Add `run`, `test run` and `analyze` to the agentload command."""
    p = cli.command("run", group="execute", help="drive one arm x rate x seed of a test into a run directory")
    p.add_argument("--config", required=True, help="test YAML (names the cell, workload, protocol and arms)")
    p.add_argument("--arm", required=True, help="arm name, e.g. BURST")
    p.add_argument("--rate", required=True, type=float, help="arrival rate in multiples of the cell's lambda_ref")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--engine", default="sim", help="engine backend (default: sim)")
    p.add_argument("--out", help="run directory (default: results/runs/<test>-<time>/<arm>-r<rate>-s<seed>)")
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
    _add_ref_options(tr)
    _add_engine_options(tr)
    tr.set_defaults(func=_cmd_test_run)

    a = cli.command("analyze", group="judge", help="score run directories with a registered rule; write verdict, report, figure")
    a.add_argument("runs", nargs="+", help="run directories, or folders holding them")
    a.add_argument("--test", help="the test YAML: its arms, rates and seeds are the registered ones (missing runs count)")
    a.add_argument("--out", help="report folder (default: <common parent>/analysis)")
    _add_ref_options(a)
    a.set_defaults(func=_cmd_analyze)
