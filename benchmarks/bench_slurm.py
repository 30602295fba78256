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
- per registered job (`agentload submit`, slurm/job.py), N one-job submissions of a registration
  in a fixture repository (tests/support/slurm_fixture.py) on the emulator: Submit -> Start (sacct),
  Start -> the job script running (its Python start and imports), Start -> the time check passed
  (registration loaded, code and remote facts checked), Start -> engine healthy (a fresh server
  launched and answering /health), and the server's own launch -> healthy; with --vllm (and
  AGENTLOAD_VLLM_PYTHON), one job on the real CPU vLLM too.

Needs root (it stops and starts the cluster). The cluster is left as it was found (up or down).

    .venv/bin/python benchmarks/bench_slurm.py [--jobs 5] [--engine-jobs 3] [--vllm] [--fresh] [--json out.json]
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

from slurm import accounting_export as X  # noqa: E402
from slurm import scheduler as S  # noqa: E402
from slurm.job_options import JobOptions  # noqa: E402
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
        jobs.append(
            {"job_id": job.job_id, "t_call": t_call, "t_submitted": t_submitted, "t_func": t_func, "t_result": t_result}
        )
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


def _iso(t: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(t)


def engine_overhead(n: int, folder: Path, vllm: bool = False) -> dict[str, Any]:
    """Per-job overhead of registered jobs: from the scheduler's start to a healthy engine."""
    sys.path.insert(0, str(ROOT / "tests"))
    import orjson
    from support.slurm_fixture import commit, fill, make_project, tiny_vllm  # type: ignore[import-not-found]

    from slurm.collect import collect
    from slurm.submit import SubmitOptions, submit_registration

    work, _ = make_project(folder / "project")
    reg = fill(work, "bench-one", seeds="[3]", arms="[noburst]")
    vreg = tiny_vllm(work) if vllm else None
    commit(work, "register the benchmark's registrations", push=True)
    cases: list[tuple[str, Path, SubmitOptions]] = [
        ("emulator", reg, SubmitOptions(engine="emulator", time_scale=300.0, out=str(folder / f"emu-{i}")))
        for i in range(n)
    ]
    if vreg is not None:
        import os

        from harness.servers.vllm import private_cache_env

        py = os.environ["AGENTLOAD_VLLM_PYTHON"]
        model = os.environ.get("AGENTLOAD_TINY_MODEL") or str(folder / "tiny-model")
        if not (Path(model) / "config.json").exists():
            subprocess.run([py, str(ROOT / "harness/servers/tiny_model.py"), model], check=True, capture_output=True)
        cache = os.environ.get("AGENTLOAD_ENGINE_CACHE") or str(folder / "engine-cache")
        # no extra_args: the registered cell carries the CPU vLLM's launch extras
        cases.append(
            (
                "vllm",
                vreg,
                SubmitOptions(
                    engine="vllm",
                    out=str(folder / "vllm"),
                    job=JobOptions(job_env=private_cache_env(cache)),
                    engine_options={
                        "server_cmd": [py, "-m", "vllm.entrypoints.openai.api_server"],
                        "model": model,
                        "health_timeout": 900.0,
                    },
                ),
            )
        )
    jobs = []
    for engine, path, opts in cases:
        doc = submit_registration(path, opts)
        res = collect(doc["_path"], wait_s=1200)
        (job,) = doc["jobs"]
        (row,) = X.read_accounting_export(Path(doc["_path"]).parent / "provenance" / "accounting.json")
        meta = orjson.loads((Path(doc["_path"]).parent / job["run_dir"] / "meta.json").read_bytes())
        start = row.start
        assert start is not None and row.submit is not None and res["complete"], res
        es = meta["engine_start"]
        jobs.append(
            {
                "engine": engine,
                "job_id": job["job_id"],
                "state": row.state,
                "sacct_submit_to_start_s": (start - row.submit).total_seconds(),
                "start_to_job_script_s": (_iso(meta["job"]["started_at"]) - start).total_seconds(),
                "start_to_time_check_s": (_iso(meta["time_check"]["checked_at"]) - start).total_seconds(),
                "start_to_engine_healthy_s": (_iso(es["healthy_at"]) - start).total_seconds(),
                "engine_launch_to_healthy_s": es["seconds"],
            }
        )
    keys = [
        "sacct_submit_to_start_s",
        "start_to_job_script_s",
        "start_to_time_check_s",
        "start_to_engine_healthy_s",
        "engine_launch_to_healthy_s",
    ]
    summary = {}
    for eng in sorted({j["engine"] for j in jobs}):
        js = [j for j in jobs if j["engine"] == eng]
        summary[eng] = {
            k: {"median": statistics.median(j[k] for j in js), "max": max(j[k] for j in js), "n": len(js)} for k in keys
        }
    return {
        "jobs": jobs,
        "summary": summary,
        "note": "sacct times are whole seconds; the job's own times are microseconds (UTC)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--fresh", action="store_true", help="purge the cluster state first (new datadir)")
    ap.add_argument(
        "--engine-jobs",
        type=int,
        default=3,
        help="registered emulator jobs for the start-to-healthy overhead (0: none)",
    )
    ap.add_argument(
        "--vllm", action="store_true", help="also one registered job on the real CPU vLLM (AGENTLOAD_VLLM_PYTHON)"
    )
    ap.add_argument(
        "--no-bring-up", action="store_true", help="do not stop and restart the cluster (others may be using it)"
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    was_up = status().up
    result: dict[str, Any] = {"was_up": was_up}
    try:
        if args.no_bring_up:
            ensure_up(echo=None)
        else:
            result["bring_up"] = bring_up(args.fresh)
            for k, v in result["bring_up"].items():
                print(f"{k:>12}: {v:6.2f} s")
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
            result["per_job"] = per_job(args.jobs, Path(tmp))
        print(f"per job over N={args.jobs} trivial submitit jobs (median / max):")
        for k, v in result["per_job"]["summary"].items():
            print(f"  {k:>30}: {v['median']:6.2f} / {v['max']:6.2f} s")
        if args.engine_jobs or args.vllm:
            with tempfile.TemporaryDirectory(prefix="bench-slurm-engine-") as tmp:
                result["per_registered_job"] = engine_overhead(args.engine_jobs, Path(tmp), vllm=args.vllm)
            for eng, summ in result["per_registered_job"]["summary"].items():
                print(f"per registered job on {eng} (N={next(iter(summ.values()))['n']}, median / max):")
                for k, v in summ.items():
                    print(f"  {k:>30}: {v['median']:6.2f} / {v['max']:6.2f} s")
    finally:
        if not was_up:
            down(echo=None)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
