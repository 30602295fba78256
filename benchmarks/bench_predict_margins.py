"""What the flip margins add to `predict make sim`: the README main job's registration
(prereg/registrations/e2-sglang-a100-300k.yaml, 3 arms x 2 rates, 3 fresh seeds per arm and rate)
made without margins and with them, alternating in one process, on this host.

Prints each try's wall time, the simulated runs the margins needed, the ratio with / without, and
every arm x rate's margins and label; writes benchmarks/predict_margins.json.

    .venv/bin/python benchmarks/bench_predict_margins.py [--jobs 2] [--repeat 1] [--seeds 3] [--tolerance 0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prereg.margin import DEFAULT_MAX_CHANGE, DEFAULT_TOLERANCE  # noqa: E402
from prereg.predict_sim import simulator_predictions  # noqa: E402
from prereg.scoring import margin_text  # noqa: E402

REG = ROOT / "prereg" / "registrations" / "e2-sglang-a100-300k.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registration", default=str(REG))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="pairs of tries (without, with), alternating")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    ap.add_argument("--max-change", type=float, default=DEFAULT_MAX_CHANGE)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "predict_margins.json"))
    args = ap.parse_args()
    tries = []
    last = None
    for i in range(args.repeat):
        for with_margins in [False, True] if i % 2 == 0 else [True, False]:
            t0 = time.monotonic()
            c0 = os.times()
            pf = simulator_predictions(
                args.registration,
                n_seeds=args.seeds,
                jobs=args.jobs,
                margins=with_margins,
                margin_tolerance=args.tolerance,
                margin_max_change=args.max_change,
            )
            c1 = os.times()
            wall = time.monotonic() - t0
            cpu = (c1.user - c0.user) + (c1.children_user - c0.children_user)
            runs = (pf.margins or {}).get("simulated_runs", 0)
            tries.append({"margins": with_margins, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "runs": runs})
            state = "on " if with_margins else "off"
            print(
                f"try {len(tries)}: margins {state} {wall:7.1f} s wall {cpu:7.1f} s cpu, margin runs {runs}", flush=True
            )
            if with_margins:
                last = pf
    off = [t["wall_s"] for t in tries if not t["margins"]]
    on = [t["wall_s"] for t in tries if t["margins"]]
    ratio = (sum(on) / len(on)) / (sum(off) / len(off))
    print(f"with margins / without: x{ratio:.2f} wall (mean of {len(on)} and {len(off)} tries)")
    cells = []
    assert last is not None
    seen = set()
    for p in last.predictions:
        if p.quantity == "state" and p.margin is not None:
            key = (p.about.arm, p.about.rate)
            if key in seen:
                continue
            seen.add(key)
            m = p.margin
            cells.append({"arm": p.about.arm, "rate": p.about.rate, **m})
            print(
                f"  {p.about.arm:8} x {p.about.rate:<5g} {m['state']:10} {m['label']:10} {m['margin']:.3f}  "
                f"{margin_text(m)}"
            )
    Path(args.out).write_text(
        json.dumps(
            {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
                "registration": str(Path(args.registration).relative_to(ROOT)),
                "seeds": args.seeds,
                "jobs": args.jobs,
                "tolerance": args.tolerance,
                "max_change": args.max_change,
                "tries": tries,
                "ratio_wall": round(ratio, 2),
                "noise": (last.margins or {}).get("noise"),
                "cells": cells,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
