"""Wall time of the main job: the README's E2 paired test of the SGLang 300k cell in the simulator.

Runs exactly the README command (18 runs of 8700 s of virtual time, then the verdict) as a
subprocess, so the number includes interpreter start-up, plan generation, recording, analysis and
the figure, and writes the result to benchmarks/main_job.json. The budget is 5 minutes on
a 2-core machine.

    .venv/bin/python benchmarks/bench_main_job.py [--jobs N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "configs/tests/e2-sglang-300k.yaml"
BUDGET_S = 300.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--jobs", type=int, default=None, help="worker processes (default: CPU count, as the README command)"
    )
    ap.add_argument("--keep", help="write the runs here and keep them (default: a temporary folder)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "main_job.json"))
    args = ap.parse_args(argv)

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
    if proc.returncode not in (0, 1):  # 1 = the verdict is not PASS; anything else is a crash
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if proc.returncode == 0 and wall <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
