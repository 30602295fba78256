"""Wall time of every registered test in the simulator, and each simulated outcome beside the paper's.

Runs `agentload test run CONFIG --engine sim --jobs N` for every test under configs/tests/ (one
after another, each with N worker processes), then re-scores each output folder with `agentload
analyze` and checks that the verdict is the same. Prints a table (test, runs, wall, simulated
outcome per group, the paper's real-engine outcome) and writes benchmarks/all_tests.json. The
budget is 15 minutes on a 2-core machine with --jobs 2.

    .venv/bin/python benchmarks/bench_all_tests.py [--jobs 2] [--keep DIR] [--only NAME ...] [--suite]

--suite runs them as one command instead, `agentload test run configs/tests/*.yaml --jobs N`:
one pool for every run, each test scored as its runs finish (runs/suite.py), a run that is another
test's simulation copied rather than played (runs/shared_sims.py; `--simulate-each` plays them all);
the wall of that one command is the figure, each test's own span is in its row.

--against DIR (a checkout of another commit, e.g. `git worktree add --detach /tmp/old 7201407`)
times the one command instead in both checkouts, this one first, --repeats times alternating: the
tests whose configs both checkouts have, each checkout running its own code and configs
(benchmarks/bench_main_job.py's entry point rule); prints each wall and CPU, the ratio of the
medians, and whether every test's verdict is the same in both (nothing is written).
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
sys.path.insert(0, str(ROOT))
BUDGET_S = 900.0

from analysis.reports.common import LETTER  # noqa: E402 - the reports' own letters for the per-seed strings
from benchmarks.bench_main_job import run_in_tree  # noqa: E402

# The paper's real-engine outcome per test (rules-digest sec. 6), for the closing comparison.
PAPER = {
    "e2-sglang-300k": "PASS both (BURST TIT / TTT)",
    "e2-sglang-native": "PASS both (TTT / TTT)",
    "e2-vllm-300k": "PASS both (TDT / TIT)",
    "e2-sglang-h200-600k": "PASS both (TIT / TTT)",
    "e2-llama-300k": "FAIL 1.35 (1/3), PASS 1.65",
    "basin-1": "PASS",
    "basin-2": "BRACKETED",
    "toolslow": "NOT-MET (30 s stuck 1/3)",
    "toolslow-w": "TRAPS, pooled S1-S4 pass",
    "toolslow-d15": "NO-TRAP (seed 0 stuck)",
    "shed": "PASS",
    "rescue-r1": "PASS, 6/6 rescued",
    "rescue-r4": "PASS, 3/3 rescued",
    "cut-a": "PASS, 3/3 theory-favoured",
    "cut-b": "PASS, 3/3 theory-favoured",
    "mirror-165": "PASS, RENEWAL 3/3",
    "mirror-135": "PASS, RENEWAL 3/3",
    "e0b-sglang-300k": "EDGE 2.0 (stable <= 2.0)",
}


def summary(v: dict) -> str:
    """One line: the test outcome, per group its outcome and the decisive labels."""
    if "rates" in v:  # the paired E2 form
        parts = []
        for r in v["rates"]:
            b = "".join(LETTER.get(v2.get("burst", "MISSING"), "?") for _, v2 in sorted(r["seeds"].items()))
            parts.append(f"{r['rate']:g} {r['verdict']} ({b})")
        return f"{v['verdict']}: " + "; ".join(parts)
    parts = []
    for g in v["groups"]:
        counts = ", ".join(f"{k} {n}" for k, n in g["counts"].items() if isinstance(n, (int, float)))
        parts.append(f"{g['group']} {g['outcome']} [{counts}]")
    extra = ""
    td = v.get("test_derived") or {}
    if "edge" in td:
        extra = f" edge {td['edge']}"
    return f"{v['verdict']}{extra}: " + "; ".join(parts)


def _norm(v: dict) -> dict:
    for r in v.get("runs", []):
        for sect in ("stats", "quantities"):
            (r.get(sect) or {}).pop("wall_s", None)
        r.pop("run_dir", None)
    v["runs"] = sorted(v.get("runs", []), key=lambda r: (r["arm"], r["rate"] or 0, r["seed"]))
    return v


def _child_cpu() -> float:
    """CPU seconds used by finished child processes (and their workers): a figure the other
    users of a shared machine do not inflate, unlike the wall time."""
    t = os.times()
    return t.children_user + t.children_system


def _kind(path: Path) -> tuple[str, float, int]:
    """(engine, protocol duration, runs) of a test config: runs of one kind cost alike."""
    sys.path.insert(0, str(ROOT))
    from harness.config import load_test

    b = load_test(path)
    return b.cell.engine.name, float(b.protocol.duration), len(b.arms) * len(b.test.rates) * len(b.test.seeds)


def extrapolate(rows: list[dict], every: list[Path]) -> dict:
    """The test-run wall of every config from a subset: each config's runs at the measured wall per
    run of the subset's tests of the same engine and duration (the nearest duration of that engine
    when none matches), measured tests at their own figure."""
    per: dict[tuple[str, float], list[float]] = {}
    measured = {r["test"]: r for r in rows if r.get("runs")}
    for r in measured.values():
        eng, dur, _ = _kind(ROOT / "configs" / "tests" / f"{r['test']}.yaml")
        per.setdefault((eng, dur), []).append(r["wall_s"] / r["runs"])
    total, runs, basis = 0.0, 0, {}
    for t in every:
        eng, dur, n = _kind(t)
        runs += n
        if t.stem in measured:
            total += measured[t.stem]["wall_s"]
            continue
        same = [k for k in per if k[0] == eng] or list(per)
        key = min(same, key=lambda k: (k[1] != dur, abs(k[1] - dur)))
        rate = sum(per[key]) / len(per[key])
        total += n * rate
        basis[t.stem] = {"runs": n, "s_per_run": round(rate, 2), "from": f"{key[0]} {key[1]:g} s"}
    return {
        "runs": runs,
        "test_run_wall_s": round(total, 1),
        "budget_s": BUDGET_S,
        "within_budget": total <= BUDGET_S,
        "method": "unmeasured configs: runs x the subset's wall per run of the same engine and protocol duration",
        "basis": basis,
    }


def _shared(base: Path) -> int | None:
    """Runs of the one command that were copies of another test's simulation (its wall.json)."""
    wall = base / "wall.json"
    return json.loads(wall.read_text()).get("shared") if wall.exists() else None


def _suite_in(tree: Path, names: list[str], jobs: int, out: Path) -> tuple[float, float]:
    """`agentload test run` of the named tests in one command, by the code checked out at `tree`:
    (wall, CPU seconds of the command and its workers)."""
    configs = [f"configs/tests/{n}.yaml" for n in names]
    argv = ["test", "run", *configs, "--engine", "sim", "--jobs", str(jobs), "--out", str(out), "--plain"]
    t0, c0 = time.monotonic(), _child_cpu()
    run_in_tree(tree, argv, "the suite")  # exit 1: some test's verdict is not a pass (by design for a few)
    return time.monotonic() - t0, _child_cpu() - c0


def compare_suites(other: Path, jobs: int, repeats: int) -> int:
    """The one command in this checkout and in `other`, alternating; see the module docstring."""
    names = sorted({p.stem for p in (ROOT / "configs" / "tests").glob("*.yaml")}
                   & {p.stem for p in (other / "configs" / "tests").glob("*.yaml")})  # fmt: skip
    trees = [ROOT, other]
    walls: dict[Path, list[float]] = {t: [] for t in trees}
    verdicts: dict[Path, dict[str, str | None]] = {}
    with tempfile.TemporaryDirectory(prefix="agentload-all-") as tmp:
        for r in range(repeats):
            for i, t in enumerate(trees):
                out = Path(tmp) / f"{i}-{r}"
                wall, cpu = _suite_in(t, names, jobs, out)
                walls[t].append(wall)
                print(f"repeat {r + 1}: {t}: {len(names)} tests, {wall:.1f} s wall ({cpu:.1f} s CPU)", flush=True)
                verdicts[t] = {
                    n: json.loads((out / n / "verdict.json").read_text())["verdict"]
                    if (out / n / "verdict.json").exists()
                    else None
                    for n in names
                }
    med = {t: statistics.median(v) for t, v in walls.items()}
    # a test with no verdict file (e.g. one test alone, whose output has no per-test folder) is not
    # "the same" in both: it was not compared
    differ = [n for n in names if verdicts[ROOT][n] is None or verdicts[ROOT][n] != verdicts[other][n]]
    print(
        f"median wall: this checkout {med[ROOT]:.1f} s, {other} {med[other]:.1f} s -> x{med[other] / med[ROOT]:.2f}; "
        + ("every verdict the same" if not differ else f"verdicts differ: {', '.join(differ)}")
    )
    return 0 if not differ else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="write the tests' output here and keep it (default: a temporary folder)")
    ap.add_argument("--only", nargs="*", help="test names to run (default: every config)")
    ap.add_argument(
        "--out", default=None, help="JSON written (default: benchmarks/all_tests.json, --suite: all_tests_suite.json)"
    )
    ap.add_argument(
        "--simulate-each",
        action="store_true",
        help="--suite: play every run, even one whose simulation another test's run already is (no shared runs)",
    )
    ap.add_argument(
        "--suite",
        action="store_true",
        help="one `agentload test run` of every config (one pool) instead of one per config",
    )
    ap.add_argument("--against", help="time the one command in this checkout and in this one (see above)")
    ap.add_argument("--repeats", type=int, default=1, help="--against: runs per checkout, alternating")
    args = ap.parse_args(argv)
    if args.against:
        return compare_suites(Path(args.against).resolve(), args.jobs, args.repeats)
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / ("all_tests_suite.json" if args.suite else "all_tests.json"))

    tests = sorted(p for p in (ROOT / "configs" / "tests").glob("*.yaml") if not args.only or p.stem in args.only)
    tmp = None
    base = Path(args.keep) if args.keep else Path(tmp := tempfile.mkdtemp(prefix="agentload-all-"))
    exe = Path(sys.executable).parent / "agentload"
    cmd0 = [str(exe) if exe.exists() else "agentload"]
    rows = []
    t_all = time.monotonic()
    suite_wall = suite_cpu = None
    if args.suite:
        cmd = [
            *cmd0,
            "test",
            "run",
            *[str(t.relative_to(ROOT)) for t in tests],
            "--engine",
            "sim",
            "--jobs",
            str(args.jobs),
            "--out",
            str(base),
            "--plain",
            *(["--simulate-each"] if args.simulate_each else []),
        ]
        t0, c0 = time.monotonic(), _child_cpu()
        suite_proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        suite_wall, suite_cpu = time.monotonic() - t0, _child_cpu() - c0
        print(
            f"one command, {len(tests)} tests: {suite_wall:.1f} s wall ({suite_cpu:.1f} s CPU), exit "
            f"{suite_proc.returncode}",
            flush=True,
        )
    for t in tests:
        out = base / t.stem
        if args.suite:
            proc = suite_proc
            inner0 = json.loads((out / "wall.json").read_text()) if (out / "wall.json").exists() else {}
            wall, cpu = float(inner0.get("wall_s", float("nan"))), None  # the test's own span inside the one command
        else:
            cmd = [
                *cmd0,
                "test",
                "run",
                str(t.relative_to(ROOT)),
                "--engine",
                "sim",
                "--jobs",
                str(args.jobs),
                "--out",
                str(out),
                "--plain",
            ]
            t0, c0 = time.monotonic(), _child_cpu()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall, cpu = time.monotonic() - t0, _child_cpu() - c0
        vpath = out / "verdict.json"
        if not vpath.exists():
            rows.append({"test": t.stem, "wall_s": round(wall, 1), "error": proc.stderr[-2000:]})
            print(f"{t.stem}: no verdict (rc {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr, flush=True)
            continue
        v = json.loads(vpath.read_text())
        # rescore from the run directories alone: `agentload analyze` must give the same verdict
        a = subprocess.run(
            [*cmd0, "analyze", str(out), "--test", str(t.relative_to(ROOT)), "--out", str(out / "rescored")],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        same = (out / "rescored" / "verdict.json").exists() and _norm(
            json.loads((out / "rescored" / "verdict.json").read_text())
        ) == _norm(json.loads(vpath.read_text()))
        inner = json.loads((out / "wall.json").read_text()) if (out / "wall.json").exists() else {}
        row = {
            "test": t.stem,
            "runs": inner.get("runs"),
            "wall_s": round(wall, 1),
            "cpu_s": None if cpu is None else round(cpu, 1),
            "verdict": v["verdict"],
            "simulated": summary(v),
            "paper": PAPER.get(t.stem, "?"),
            "analyze_same": same,
            "analyze_rc": a.returncode,
        }
        rows.append(row)
        print(
            f"{t.stem:<22} {row['runs']!s:>4} runs {wall:7.1f} s ({'-' if cpu is None else f'{cpu:.1f}'} s CPU)  "
            f"{row['simulated']}  | paper: {row['paper']}"
            f"{'' if same else '  [analyze DIFFERS]'}",
            flush=True,
        )
    total = time.monotonic() - t_all
    every = sorted((ROOT / "configs" / "tests").glob("*.yaml"))
    result = {
        "benchmark": "all_tests",
        "jobs": args.jobs,
        "tests": len(rows),
        "runs": sum(r.get("runs") or 0 for r in rows),
        "wall_s": round(total, 1),
        # `agentload test run` alone, without the rescoring (--suite: the one command's wall)
        "test_run_wall_s": round(suite_wall if args.suite else sum(r.get("wall_s") or 0 for r in rows), 1),
        "cpu_s": round(suite_cpu if args.suite else sum(r.get("cpu_s") or 0 for r in rows), 1),
        "mode": "suite (one command, one pool)" if args.suite else "one command per test",
        # --suite: runs given a copy of another test's identical simulation (runs/shared_sims.py)
        "shared": _shared(base) if args.suite else 0,
        "budget_s": BUDGET_S,
        "within_budget": (suite_wall if args.suite else sum(r.get("wall_s") or 0 for r in rows)) <= BUDGET_S,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": rows,
    }
    if args.only:  # a subset: what every config would take, from the measured wall per run of its kind
        result["only"] = list(args.only)
        result["extrapolation"] = extrapolate(rows, every)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if "extrapolation" in result:
        x = result["extrapolation"]
        print(
            f"every config ({x['runs']} runs), extrapolated from this subset: {x['test_run_wall_s']:.0f} s of test "
            "runs "
            f"({x['method']})",
            flush=True,
        )
    print(
        f"\n{len(rows)} tests, {result['runs']} runs, {result['mode']}: test runs {result['test_run_wall_s']:.0f} s "
        "wall "
        f"({result['cpu_s']:.0f} s CPU) with --jobs {args.jobs} (budget {BUDGET_S:.0f} s: "
        f"{'within' if result['within_budget'] else 'OVER'}); "
        f"with the rescoring {total:.0f} s; wrote {args.out}"
    )
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all("error" not in r and r.get("analyze_same") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
