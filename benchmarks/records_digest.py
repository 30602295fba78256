"""SHA-256 of the record tables of a fixed set of simulated runs: the check that a change to the
engine model (or to the workload's draws) left every record byte-identical.

A speed change must not move a single record. This plays a fixed set of runs of the registered
tests in the simulator (the E2 SGLang and vLLM arms at both rates, seed 0, and one run of each
other family that drives the engine differently: BASIN, SHED, rescue's flush, CUT, MIRROR, the CPU
cells) and prints one digest per run's record table. Run it on the old code with --out, then on
the new with --compare:

    nice -n 19 .venv/bin/python benchmarks/records_digest.py --out /tmp/before.json
    nice -n 19 .venv/bin/python benchmarks/records_digest.py --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from harness.client.closed import ClosedClient  # noqa: E402
from harness.config import CellConfig, WorkloadConfig, config_ref, load_config, load_test  # noqa: E402
from harness.drivers.virtual import simulate  # noqa: E402

try:  # the package layout since the DAG; harness.protocols before it (digests of older commits)
    from runs.arms import execute_run
except ImportError:  # pragma: no cover - an older checkout
    from harness.protocols.arms import execute_run  # type: ignore[no-redef]
from harness.refengine.model import EngineModel  # noqa: E402

TABLES = ("turns.parquet", "sessions.parquet", "gauges.parquet", "gate_events.parquet")

# (test config, arm, rate, seed)
RUNS: list[tuple[str, str, float, int]] = [
    *(
        (f"configs/tests/e2-{e}-300k.yaml", arm, rate, 0)
        for e in ("sglang", "vllm")
        for arm in ("burst", "noburst", "capped")
        for rate in (1.35, 1.65)
    ),
    ("configs/tests/basin-1.yaml", "basin-n100", 1.65, 0),
    ("configs/tests/shed.yaml", "shed-t600", 1.35, 0),
    ("configs/tests/rescue-r1.yaml", "rescue-r1", 1.65, 0),
    ("configs/tests/cut-a.yaml", "cut-a115", 1.65, 0),
    ("configs/tests/mirror-135.yaml", "burst", 1.35, 0),
]
EXTRA: list[tuple[str, str, float, int]] = [  # --extra: the other cells the simulator runs
    ("configs/tests/e2-vllm-cpu.yaml", "burst", 0, 0),
    ("configs/tests/e2-sglang-native.yaml", "burst", 0, 0),
    ("configs/tests/tutorial-sglang.yaml", "", 0, 0),
    ("configs/tests/tutorial-vllm.yaml", "", 0, 0),
]

# --variants: closed populations on cell settings no registered test uses, so every branch of both
# flavours is covered: (label, cell, changed fields, population, simulated seconds)
VARIANTS: list[tuple[str, str, dict[str, object], int, float]] = [
    ("sglang mixed chunks", "sglang-a100-300k", {"batching": "mixed"}, 200, 3000.0),
    ("sglang lpm", "sglang-a100-300k", {"schedule_policy": "lpm"}, 150, 3000.0),
    ("sglang cache off", "sglang-a100-300k", {"prefix_cache": False}, 100, 2000.0),
    ("sglang paged 32k", "sglang-a100-300k", {"page_size": 16, "kv_pool_tokens": 120_000}, 60, 3000.0),
    ("vllm cache off", "vllm-a100-300k", {"prefix_cache": False}, 80, 2000.0),
    ("vllm tight pool", "vllm-a100-300k", {"kv_pool_tokens": 60_000}, 40, 3000.0),
]


def digest_variant(cell_name: str, changes: dict[str, object], n: int, duration: float) -> dict[str, str]:
    """A closed population of n sessions on a changed cell: the SHA-256 of its turns and gauges."""
    base = load_config(config_ref(cell_name, "cells"), CellConfig)
    cell = CellConfig.model_validate({**base.model_dump(), **changes})
    workload = load_config(config_ref("standard", "workloads"), WorkloadConfig)
    client = ClosedClient(workload, n, seed=0)
    gauges: list[tuple[float, dict[str, float]]] = []
    res = simulate(
        client, EngineModel(cell), until=duration, gauge_interval=5.0, on_gauge=lambda t, v: gauges.append((t, v))
    )
    turns = json.dumps(client.sink.turns, sort_keys=True, default=repr).encode()
    return {
        "turns": hashlib.sha256(turns).hexdigest(),
        "gauges": hashlib.sha256(json.dumps(gauges, sort_keys=True).encode()).hexdigest(),
        # the status as text: an enum since f3248ed, a plain string before (older digests)
        "end": repr((str(res.status), res.end_time, res.sent, res.ok, res.errors)),
    }


def _resolve(test: str, arm: str, rate: float) -> tuple[str, float]:
    """An empty arm or zero rate: the test's first arm and its highest rate."""
    t = load_test(ROOT / test).test
    return arm or t.arms[0], rate or max(t.rates)


def digest_run(test: str, arm: str, rate: float, seed: int, out: Path) -> dict[str, str]:
    """Play one run into `out`; the SHA-256 of each record table."""
    res = execute_run(load_test(ROOT / test), arm, rate, seed, "sim", out)
    if res.status != "COMPLETED":
        raise SystemExit(f"{test} {arm} {rate} {seed}: {res.status}: {res.reason}")
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in TABLES if (out / name).exists()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the digests here (JSON)")
    ap.add_argument("--compare", help="digests written by an earlier --out: exit 1 unless all are equal")
    ap.add_argument("--extra", action="store_true", help="also the CPU, native and tutorial cells")
    ap.add_argument("--variants", action="store_true", help="also closed populations on cell settings no test uses")
    ap.add_argument("--only", help="only runs whose label contains this")
    ap.add_argument("--engine", choices=("sglang", "vllm"), help="only runs on this engine's cells")
    args = ap.parse_args(argv)
    runs = RUNS + (EXTRA if args.extra else [])
    before = json.loads(Path(args.compare).read_text()) if args.compare else {}
    got: dict[str, dict[str, str]] = {}
    differ = 0
    with tempfile.TemporaryDirectory(prefix="records-digest-") as tmp:
        for i, (test, arm, rate, seed) in enumerate(runs):
            arm, rate = _resolve(test, arm, rate)
            label = f"{Path(test).stem} {arm} {rate} s{seed}"
            if args.only and args.only not in label:
                continue
            if args.engine and load_test(ROOT / test).cell.engine.name != args.engine:
                continue
            t0 = time.process_time()
            got[label] = d = digest_run(test, arm, rate, seed, Path(tmp) / str(i))
            cpu = time.process_time() - t0
            combined = hashlib.sha256("".join(d[k] for k in sorted(d)).encode()).hexdigest()
            verdict = ""
            if label in before:
                same = before[label] == d
                differ += not same
                verdict = (
                    "  identical" if same else "  DIFFER " + ",".join(k for k in d if before[label].get(k) != d[k])
                )
            elif args.compare:
                verdict = "  (not in the earlier digests)"
            print(f"{label:<40} {combined[:16]}  {cpu:6.1f} s CPU{verdict}", flush=True)
    for label, cell_name, changes, n, duration in VARIANTS if args.variants else []:
        if (args.only and args.only not in label) or (args.engine and not cell_name.startswith(args.engine)):
            continue
        t0 = time.process_time()
        got[label] = d = digest_variant(cell_name, changes, n, duration)
        cpu = time.process_time() - t0
        verdict = ""
        if label in before:
            same = before[label] == d
            differ += not same
            verdict = "  identical" if same else "  DIFFER " + ",".join(k for k in d if before[label].get(k) != d[k])
        print(f"{label:<40} {d['turns'][:16]}  {cpu:6.1f} s CPU{verdict}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(got, indent=2) + "\n")
    if args.compare:
        missing = [k for k in got if k not in before]
        if missing:
            print("not in the earlier digests:", ", ".join(missing))
        print(
            f"{len(got) - differ - len(missing)} of {len(got)} runs identical"
            + (f", {differ} DIFFER" if differ else "")
        )
        return 1 if differ or missing else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
