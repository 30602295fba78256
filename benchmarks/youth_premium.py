"""The youth premium of simulated traps, measured (docs/sim2real.md, "The youth premium").

Question: simulated trapped E2 runs (SGLang 300k cell) complete 0.96-1.16 lambda_ref over the
window on seeds 0-2, the paper's trapped runs 1.13-1.35, and model F's asymptotic D is 1.13 and
1.23 lambda_ref at 1.35 and 1.65 lambda_ref. This script separates the causes:

1. for each simulated BURST run, model F driven by the *same* frozen plan (analysis.theory.fluid,
   plan_fluid_from_plan): window completions, turns served, served prompt -- does the simulator's
   engine (admission order, concurrency bound, decode share) deviate from FIFO all-miss service?
2. a hazard-weighted completion rate (each served turn counts P(T = k | T >= k)), which removes the
   noise of the plan's realised turn counts from the completion rate;
3. model F over many plan seeds: the window completion rate's spread across arrival plans, and
   where seeds 0-2 fall in it.

    .venv/bin/python benchmarks/youth_premium.py [--seeds 0,1,2] [--fluid-seeds 40] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.theory.fluid import plan_fluid_from_plan
from analysis.theory.model_f import model_f_from_cost
from analysis.theory.moments import workload_moments
from harness.config import load_test
from harness.workload.planfile import read_plan
from harness.workload.plans import make_plan
from runs.arms import execute_run, find_arm

TEST = "configs/tests/e2-sglang-300k.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="seeds simulated (BURST, both rates)")
    ap.add_argument("--fluid-seeds", type=int, default=40, help="plan seeds for model F's spread")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    b = load_test(TEST)
    lr = float(b.cell.lambda_ref)
    w0, w1 = b.protocol.window.start, b.protocol.window.end
    mf, _ = model_f_from_cost(b.cell.cost.model(), workload_moments(b.workload), b.cell.kv_pool_tokens, b.cell.batching)
    haz = mf.pmf / mf.G
    out = Path(args.out or tempfile.mkdtemp(prefix="youth-"))
    rows = []
    for rate in b.test.rates:
        for seed in [int(s) for s in args.seeds.split(",")]:
            d = out / f"burst-{rate}-{seed}"
            if not (d / "meta.json").exists():
                execute_run(b, "burst", rate, seed, "sim", d)
            t = pd.read_parquet(d / "turns.parquet")
            s = pd.read_parquet(d / "sessions.parquet")
            w = t[(t.status == "ok") & (t.done_time >= w0) & (t.done_time < w1)]
            done = s[(s.outcome == "completed") & (s.end >= w0) & (s.end < w1)]
            fl = plan_fluid_from_plan(mf, read_plan(d / "plan.parquet"), t_end=w1)
            r = fl.requests
            m = (r["done"] >= w0) & (r["done"] < w1)
            rows.append(
                {
                    "rate": rate,
                    "seed": seed,
                    "D_sim": len(done) / (w1 - w0) / lr,
                    "D_modelF_plan": fl.completion_rate(w0, w1) / lr,
                    "D_sim_hazard": haz[w.turn.to_numpy() - 1].sum() / (w1 - w0) / lr,
                    "D_modelF_hazard": haz[r["turn"][m] - 1].sum() / (w1 - w0) / lr,
                    "turns_sim": len(w) / (w1 - w0),
                    "turns_modelF": m.sum() / (w1 - w0),
                    "prompt_sim": float(w.prompt_tokens.mean()),
                    "prompt_modelF": float(r["prompt"][m].mean()),
                    "D_modelF_asymptotic": mf.asymptotics(rate * lr).D / lr,
                }
            )
    table = pd.DataFrame(rows)
    _, arm = find_arm(b, "burst")
    spread = {}
    for rate in b.test.rates:
        D = []
        for seed in range(args.fluid_seeds):
            fl = plan_fluid_from_plan(mf, make_plan(b.workload, b.protocol, arm, rate, lr, seed), t_end=w1)
            D.append(fl.completion_rate(w0, w1) / lr)
        D = np.asarray(D)
        spread[str(rate)] = {
            "seeds": args.fluid_seeds,
            "mean": float(D.mean()),
            "sd": float(D.std(ddof=1)),
            "min": float(D.min()),
            "max": float(D.max()),
            "rank_of_seeds_0_2": [int((D[k] > D).sum()) for k in range(3)],
        }
    pd.set_option("display.width", 200)
    print(table.round(3).to_string(index=False))
    print(json.dumps(spread, indent=1))
    (out / "youth_premium.json").write_text(json.dumps({"runs": rows, "model_f_spread": spread}, indent=1))
    print(f"wrote {out / 'youth_premium.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
