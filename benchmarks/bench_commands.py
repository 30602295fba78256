"""Fixed cost of the read-only commands on one test: `status` and `analyze` of an 18-run test, and
`prereg check` of its registration.

Copies a committed evidence test (default evidence/e2-vllm-cpu-tiny-65k-quarter/test) to a
temporary folder and times, as subprocesses in wall seconds, each command a reviewer runs on it:

    start-up   agentload status --help            (the command's imports and its parser)
    status     agentload status --no-scheduler TESTDIR
    analyze    agentload analyze TESTDIR/runs --out OUT --rule RULE   (verdict, report, figure)
    check      agentload prereg check REGISTRATION   (the checkout's own file: hash, inputs, the 18
               plans regenerated, git state and label; exits 1 where it refuses, e.g. a dirty tree)

Each is run --repeats times; the best and the median wall are printed, and the median CPU seconds
(user + system of the command's process): a figure that other work on a shared machine inflates
far less than the wall. The target (issue 24) is
status, analyze and prereg check at or under 1 s each. With --tree DIR (a `git worktree` of another commit),
the same commands run from that checkout's code as well, the checkouts alternating within every
repeat, so that a shared machine's load falls on both alike:

    git worktree add /tmp/before HEAD~1
    .venv/bin/python benchmarks/bench_commands.py --tree /tmp/before --repeats 5

Every checkout's commands run under this interpreter as `python -m cli.main` from the checkout's
top folder, which puts that checkout's packages first on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EVIDENCE = ROOT / "evidence" / "e2-vllm-cpu-tiny-65k-quarter" / "test"
RULE = "e2-cpu-65k-quarter"
REGISTRATION = "prereg/registrations/e2-vllm-cpu-tiny-65k-quarter.yaml"  # relative: each checkout's own
TARGET_S = 1.0
BYTECODE = True  # main(): --no-bytecode leaves the environment's PYTHONDONTWRITEBYTECODE as it is

from benchmarks.bench_main_job import crashed  # noqa: E402 - the one test of a crash for both benchmarks


def commands(testdir: Path, out: Path, rule: str) -> dict[str, list[str]]:
    """The commands timed, as arguments after `agentload`."""
    return {
        "start-up": ["status", "--help"],
        "status": ["status", "--no-scheduler", str(testdir)],
        "analyze": ["analyze", str(testdir / "runs"), "--out", str(out), "--rule", rule],
        "check": ["prereg", "check", REGISTRATION],
    }


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of `agentload ARGS` run from the checkout `tree`; a failed command is an
    error (a timing of a command that did not do its work is no timing)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # the unmeasured first pass writes each checkout's bytecode, as a user's first command does; an
    # environment that forbids it (PYTHONDONTWRITEBYTECODE, set on some machines) would make every
    # timed command compile its modules from source again, ~0.06 s of each (see --no-bytecode)
    if BYTECODE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    c0 = _children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=tree, env=env, capture_output=True, text=True, timeout=600
    )
    dt, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if crashed(done):  # analyze exits 1 for a verdict other than PASS, check for a refusal
        raise SystemExit(f"agentload {' '.join(args)} (from {tree}) exited {done.returncode}:\n{done.stderr[-2000:]}")
    return dt, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evidence", default=str(EVIDENCE), help="the test directory copied and timed")
    ap.add_argument("--rule", default=RULE, help="the rule analyze scores the runs with")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[], help="another checkout to time beside this one")
    ap.add_argument("--out", help="write the timings as JSON here")
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE if the environment sets it (every command compiles from source)",
    )
    args = ap.parse_args(argv)
    global BYTECODE
    BYTECODE = not args.no_bytecode

    trees = [ROOT, *(Path(t).resolve() for t in args.tree)]
    walls: dict[str, dict[str, list[float]]] = {str(t): {} for t in trees}
    cpus: dict[str, dict[str, list[float]]] = {str(t): {} for t in trees}
    with tempfile.TemporaryDirectory(prefix="bench-commands-") as tmp:
        testdir = Path(tmp) / "test"
        shutil.copytree(args.evidence, testdir)
        out = Path(tmp) / "analysis"
        cmds = commands(testdir, out, args.rule)
        for tree in trees:  # one unmeasured pass each: the files in the page cache, .pyc written
            for c in cmds.values():
                timed(tree, c)
        for _ in range(args.repeats):
            for name, c in cmds.items():
                for tree in trees:
                    shutil.rmtree(out, ignore_errors=True)
                    w, c_s = timed(tree, c)
                    walls[str(tree)].setdefault(name, []).append(w)
                    cpus[str(tree)].setdefault(name, []).append(c_s)

    print(
        f"{args.repeats} repeats, seconds: wall best / wall median / CPU median; "
        f"target: status, analyze and check <= {TARGET_S:g} s wall"
    )
    print(f"{'checkout':<32} " + " ".join(f"{n:>20}" for n in cmds))
    for tree in trees:
        w, c_s = walls[str(tree)], cpus[str(tree)]
        cells = [f"{min(w[n]):.2f} / {statistics.median(w[n]):.2f} / {statistics.median(c_s[n]):.2f}" for n in cmds]
        print(f"{tree!s:<32} " + " ".join(f"{c:>20}" for c in cells))
    if args.out:
        doc = {"repeats": args.repeats, "wall_s": walls, "cpu_s": cpus}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
