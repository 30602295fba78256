"""The local SLURM cluster: bring-up time and per-job overhead through submitit.

Why: the integration tests and local protocol runs submit through a real scheduler; its start-up
and its per-job latency set how fast they can be. Measured:

- bring-up: `cluster.sh down` then `up` (cold: daemons stopped, state and packages kept), `up`
  again (warm: a no-op check); with --fresh, `purge` first (a new MariaDB datadir and controller
  state, packages kept).
- per job, N sequential trivial jobs via submitit's SlurmExecutor: from the scheduler's accounting
  (Submit -> Start, Start -> End; whole seconds) and from the client's clock (submit() call -> the
  function starts in the job, the function returns -> result() returns; these include the job's
  Python start and submitit's result polling).

Needs root (it stops and starts the cluster). The cluster is left as it was found (up or down).

    .venv/bin/python benchmarks/bench_slurm.py [--jobs 5] [--fresh] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import submitit  # noqa: E402

from slurm import scheduler as S  # noqa: E402
from slurm.local import SCRIPT, down, ensure_up, status  # noqa: E402


def trivial() -> float:
    return time.time()


def timed(fn: Any, *args: Any, **kwargs: Any) -> float:
    t0 = time.monotonic()
    fn(*args, **kwargs)
    return time.monotonic() - t0


def bring_up(fresh: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    if fresh:
        t0 = time.monotonic()
        subprocess.run(["bash", str(SCRIPT), "purge"], check=True, capture_output=True)
        out["purge_s"] = time.monotonic() - t0
        out["fresh_up_s"] = timed(ensure_up, echo=None)
    out["down_s"] = timed(down, echo=None)
    out["cold_up_s"] = timed(ensure_up, echo=None)
    out["warm_up_s"] = timed(ensure_up, echo=None)
    return out


def per_job(n: int, folder: Path) -> dict[str, Any]:
    ex = submitit.SlurmExecutor(folder=folder / "%j")
    ex.update_parameters(time=5)
    jobs: list[dict[str, Any]] = []
    for _ in range(n):
        t_call = time.time()
        job = ex.submit(trivial)
        t_submitted = time.time()
        t_func = job.result()
        t_result = time.time()
        jobs.append({"job_id": job.job_id, "t_call": t_call, "t_submitted": t_submitted, "t_func": t_func, "t_result": t_result})
    rows = {r.job_id: r for r in S.wait_for_accounting([j["job_id"] for j in jobs])}
    for j in jobs:
        r = rows[j["job_id"]]
        assert r.submit and r.start and r.end
        j["sacct_submit_to_start_s"] = (r.start - r.submit).total_seconds()
        j["sacct_start_to_end_s"] = (r.end - r.start).total_seconds()
        j["client_sbatch_s"] = j["t_submitted"] - j["t_call"]
        j["client_submit_to_function_s"] = j["t_func"] - j["t_call"]
        j["client_function_to_result_s"] = j["t_result"] - j["t_func"]
        j["client_total_s"] = j["t_result"] - j["t_call"]
    keys = [
        "sacct_submit_to_start_s",
        "sacct_start_to_end_s",
        "client_sbatch_s",
        "client_submit_to_function_s",
        "client_function_to_result_s",
        "client_total_s",
    ]
    summary = {k: {"median": statistics.median(j[k] for j in jobs), "max": max(j[k] for j in jobs)} for k in keys}
    return {"jobs": jobs, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--fresh", action="store_true", help="purge the cluster state first (new datadir)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    was_up = status().up
    result: dict[str, Any] = {"was_up": was_up}
    try:
        result["bring_up"] = bring_up(args.fresh)
        for k, v in result["bring_up"].items():
            print(f"{k:>12}: {v:6.2f} s")
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
            result["per_job"] = per_job(args.jobs, Path(tmp))
        print(f"per job over N={args.jobs} trivial submitit jobs (median / max):")
        for k, v in result["per_job"]["summary"].items():
            print(f"  {k:>30}: {v['median']:6.2f} / {v['max']:6.2f} s")
    finally:
        if not was_up:
            down(echo=None)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
