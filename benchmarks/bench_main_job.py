"""Wall time of the main job: the README's E2 paired test of the SGLang 300k cell in the simulator.

Runs exactly the README command (18 runs of 8700 s of virtual time, then the verdict) as a
subprocess, so the number includes interpreter start-up, plan generation, recording, analysis and
the figure, and writes the result to benchmarks/main_job.json. The budget is 5 minutes on
a 2-core machine.

    .venv/bin/python benchmarks/bench_main_job.py [--jobs N] [--keep DIR]

Against another commit (a checkout, e.g. `git worktree add --detach /tmp/old 7201407`): the same
command is run by this checkout's code and by that one's in turn, --repeats times alternating (so
the machine's load falls on both alike), each as `python -c` of the checkout's own entry point
(cli.main, or harness.cli before the package layout of the redesign) with the checkout first on
the path; the medians, their ratio and each run's verdict are printed (nothing is written):

    .venv/bin/python benchmarks/bench_main_job.py --against /tmp/old [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "configs/tests/e2-sglang-300k.yaml"
BUDGET_S = 300.0


def entry_module(tree: Path) -> str:
    """The checkout's `agentload` entry point, as a module name (the layout moved it)."""
    return "cli.main" if (tree / "cli" / "main.py").exists() else "harness.cli"


def crashed(proc: subprocess.CompletedProcess[str]) -> bool:
    """Whether `agentload` crashed rather than answered. Exit 1 is a verdict that is not a pass (or a
    refusal) unless Python's own crash output says otherwise: an uncaught exception, or a module
    missing from a checkout of another layout, exits 1 too. Anything else above 0 is a crash."""
    if proc.returncode == 1:
        return "Traceback (most recent call last)" in proc.stderr or "No module named" in proc.stderr
    return proc.returncode != 0


def run_in_tree(tree: Path, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """`agentload ARGV` run by the code checked out at `tree` (its own entry point, the checkout first
    on the path, from its top folder); a crash (`crashed`) stops the benchmark with its error output."""
    code = f"import sys; from {entry_module(tree)} import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=tree, env=env, capture_output=True, text=True)
    if crashed(proc):
        raise SystemExit(f"{tree}: {what} crashed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def timed_in(tree: Path, jobs: int | None) -> tuple[float, str | None]:
    """The README command run by the code checked out at `tree`: (wall seconds, overall verdict)."""
    with tempfile.TemporaryDirectory(prefix="agentload-bench-") as tmp:
        out = Path(tmp) / "e2"
        argv = ["test", "run", TEST, "--engine", "sim", "--out", str(out), "--plain"]
        if jobs:
            argv += ["--jobs", str(jobs)]
        t0 = time.monotonic()
        run_in_tree(tree, argv, "the main job")
        wall = time.monotonic() - t0
        vpath = out / "verdict.json"
        return wall, (json.loads(vpath.read_text())["verdict"] if vpath.exists() else None)


def compare(trees: list[Path], jobs: int | None, repeats: int) -> None:
    """Each checkout in turn, `repeats` times; the median wall of each and how many times faster
    the first (this checkout) is than each other."""
    walls: dict[Path, list[float]] = {t: [] for t in trees}
    for r in range(repeats):
        for t in trees:
            wall, verdict = timed_in(t, jobs)
            walls[t].append(wall)
            print(f"repeat {r + 1}: {t}: {wall:.1f} s, verdict {verdict}", flush=True)
    med = {t: statistics.median(v) for t, v in walls.items()}
    now = med[trees[0]]
    for t in trees:
        ratio = "" if t == trees[0] else f"  -> this checkout is x{med[t] / now:.2f} faster"
        print(f"{t}: median {med[t]:.1f} s over {repeats}{ratio}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--jobs", type=int, default=None, help="worker processes (default: CPU count, as the README command)"
    )
    ap.add_argument("--keep", help="write the runs here and keep them (default: a temporary folder)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "main_job.json"))
    ap.add_argument("--against", action="append", default=[], help="also time the checkout in this folder")
    ap.add_argument("--repeats", type=int, default=2, help="runs per checkout with --against (alternating)")
    args = ap.parse_args(argv)
    if args.against:
        compare([ROOT, *(Path(a).resolve() for a in args.against)], args.jobs, args.repeats)
        return 0

    tmp = None
    if args.keep:
        out = Path(args.keep)
    else:
        tmp = tempfile.mkdtemp(prefix="agentload-bench-")
        out = Path(tmp) / "e2"
    exe = Path(sys.executable).parent / "agentload"
    cmd = [
        str(exe) if exe.exists() else "agentload",
        "test",
        "run",
        TEST,
        "--engine",
        "sim",
        "--out",
        str(out),
        "--plain",
    ]
    if args.jobs:
        cmd += ["--jobs", str(args.jobs)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    verdict = None
    vpath = out / "verdict.json"
    if vpath.exists():
        v = json.loads(vpath.read_text())
        verdict = {"overall": v["verdict"], "rates": {str(r["rate"]): r["verdict"] for r in v["rates"]}}
    inner = json.loads((out / "wall.json").read_text()) if (out / "wall.json").exists() else {}
    result = {
        "benchmark": "main_job",
        "command": " ".join(["agentload", *cmd[1:]]),
        "wall_s": round(wall, 2),
        "runs_wall_s": inner.get("wall_s"),
        "jobs": inner.get("jobs"),
        "budget_s": BUDGET_S,
        "within_budget": wall <= BUDGET_S,
        "exit_status": proc.returncode,
        "verdict": verdict,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if crashed(proc):
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if proc.returncode == 0 and wall <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
