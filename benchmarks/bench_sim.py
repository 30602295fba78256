"""Simulator speed: simulated seconds per wall second in a good and a trapped state.

A registered test's predictions need many 8700 s runs, so the simulator must stay well above
1000 simulated seconds per wall second on one core in both regimes: the good state (few sessions,
hits, many cheap decode iterations) and the trapped state (hundreds of sessions, every turn a long
chunked prefill, a deep queue, constant eviction).

    python benchmarks/bench_sim.py [--cell sglang-a100-300k] [--duration 8700] [--profile]

Against other commits (a checkout each, e.g. `git worktree add /tmp/old 7201407`): every state is
played by each checkout in turn, in a fresh process, --repeat times alternating (so a change in
the machine's load hits all alike); the least CPU time of each counts, and the ratios are printed.

    python benchmarks/bench_sim.py --against /tmp/old [--against /tmp/older] --repeat 3
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

from harness.client.closed import ClosedClient
from harness.config import CellConfig, WorkloadConfig, config_ref, load_config
from harness.drivers.virtual import simulate
from harness.refengine.model import EngineModel

TARGET = 1000.0  # simulated seconds per wall second
ROOT = Path(__file__).resolve().parent.parent

# One state played in a checkout's own code (its module paths as they were at that commit).
_PLAY = """
import json, sys, time
from harness.client.closed import ClosedClient
from harness.config import CellConfig, WorkloadConfig, config_ref, load_config
try:
    from harness.refengine.model import EngineModel
    from harness.drivers.virtual import simulate
except ImportError:  # before the layout of f41b868
    from harness.engine.model import EngineModel
    from harness.sim import simulate
cell_name, workload_name, n, duration = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
cell = load_config(config_ref(cell_name, "cells"), CellConfig)
workload = load_config(config_ref(workload_name, "workloads"), WorkloadConfig)
client = ClosedClient(workload, n, seed=0)
engine = EngineModel(cell)
cpu0 = time.process_time()
res = simulate(client, engine, until=duration, gauge_interval=5.0, on_gauge=lambda t, v: None)
cpu = time.process_time() - cpu0
print(json.dumps({"sim_s": res.end_time, "cpu_s": cpu, "wall_s": res.wall_seconds, "iterations": res.iterations,
                  "turns": len(client.sink.turns)}))
"""


def play_in(tree: Path, cell: str, workload: str, n: int, duration: float) -> dict[str, float]:
    """One state played by the code checked out at `tree`, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _PLAY, cell, workload, str(n), str(duration)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(
    trees: list[Path], cell: str, workload: str, states: list[tuple[str, int]], duration: float, repeat: int
) -> None:
    """Each state in each checkout, alternating; the least CPU time per checkout, and how many times
    faster the first checkout (this one) is than each other."""
    for label, n in states:
        cpu: dict[Path, list[float]] = {t: [] for t in trees}
        same = set()
        for _ in range(repeat):
            for t in trees:
                r = play_in(t, cell, workload, n, duration)
                cpu[t].append(r["cpu_s"])
                same.add((r["sim_s"], r["turns"]))
        best = {t: min(v) for t, v in cpu.items()}
        now = best[trees[0]]
        print(
            f"{label:>8} n={n:<4} "
            + "  ".join(
                f"{t.name}: {duration / best[t]:7.0f} sim-s/CPU-s ({best[t]:.2f} s)"
                + ("" if t == trees[0] else f" -> x{best[t] / now:.2f}")
                for t in trees
            )
            + ("" if len(same) == 1 else "  (runs DIFFER in end time or turns)"),
            flush=True,
        )


def bench(
    cell: CellConfig, workload: WorkloadConfig, n: int, duration: float, profile: bool = False
) -> dict[str, float]:
    client = ClosedClient(workload, n, seed=0)
    engine = EngineModel(cell)
    prof = cProfile.Profile() if profile else None
    cpu0 = time.process_time()
    if prof is not None:
        prof.enable()
    res = simulate(client, engine, until=duration, gauge_interval=5.0, on_gauge=lambda t, v: None)
    if prof is not None:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    cpu = time.process_time() - cpu0
    turns = len(client.sink.turns)
    hits = sum(1 for r in client.sink.turns if (r.get("cached_tokens") or 0) > 0.5 * (r.get("prompt_tokens") or 0))
    return {
        "n": n,
        "sim_s": res.end_time,
        "wall_s": res.wall_seconds,
        "cpu_s": cpu,
        "speed": res.end_time / res.wall_seconds,
        "cpu_speed": res.end_time / cpu if cpu > 0 else float("inf"),
        "iterations": res.iterations,
        "events": res.events,
        "turns": turns,
        "hit_fraction": hits / turns if turns else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", default="sglang-a100-300k")
    ap.add_argument("--workload", default="standard")
    ap.add_argument("--duration", type=float, default=8700.0)
    ap.add_argument("--good", type=int, default=16, help="closed population of the good-state run")
    ap.add_argument("--trapped", type=int, default=300, help="closed population of the trapped run")
    ap.add_argument("--profile", action="store_true", help="print the top functions by own time")
    ap.add_argument(
        "--against", action="append", default=[], help="also measure the checkout in this folder (alternating)"
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="plays per checkout with --against (the least CPU time counts)"
    )
    args = ap.parse_args(argv)
    if args.against:
        trees = [ROOT, *(Path(a).resolve() for a in args.against)]
        print(
            f"cell {args.cell}, {args.duration:.0f} simulated seconds per run, least CPU time of {args.repeat} "
            "alternating plays"
        )
        compare(
            trees,
            args.cell,
            args.workload,
            [("good", args.good), ("trapped", args.trapped)],
            args.duration,
            args.repeat,
        )
        return 0
    cell = load_config(config_ref(args.cell, "cells"), CellConfig)
    workload = load_config(config_ref(args.workload, "workloads"), WorkloadConfig)
    ok = True
    print(f"cell {cell.name}, {args.duration:.0f} simulated seconds per run, target {TARGET:.0f} sim-s per wall-s")
    for label, n in (("good", args.good), ("trapped", args.trapped)):
        r = bench(cell, workload, n, args.duration, args.profile)
        ok &= r["cpu_speed"] >= TARGET
        print(
            f"{label:>8} n={n:<4} {r['speed']:8.0f} sim-s/wall-s ({r['cpu_speed']:.0f} per CPU-s)  "
            f"wall {r['wall_s']:.2f} s  iterations {r['iterations']}  turns {r['turns']}  hit {r['hit_fraction']:.2f}"
        )
    print("PASS" if ok else "BELOW TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
