"""Simulator speed: simulated seconds per wall second in a good and a trapped state.

A registered test's predictions need many 8700 s runs, so the simulator must stay well above
1000 simulated seconds per wall second on one core in both regimes: the good state (few sessions,
hits, many cheap decode iterations) and the trapped state (hundreds of sessions, every turn a long
chunked prefill, a deep queue, constant eviction).

    python benchmarks/bench_sim.py [--cell sglang-a100-300k] [--duration 8700] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from harness.client.closed import ClosedClient
from harness.config import CellConfig, WorkloadConfig, config_ref, load_config
from harness.drivers.virtual import simulate
from harness.refengine.model import EngineModel

TARGET = 1000.0  # simulated seconds per wall second


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
    args = ap.parse_args(argv)
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
