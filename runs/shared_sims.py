"""Runs of different tests that are the same simulation, simulated once (`test run A.yaml B.yaml ...`).

Why: the paper's tests reuse each other's runs. E2's NOBURST at 1.35 λ_ref seed 0 on the SGLang
300k cell is also rescue R1's, TOOLSLOW's and TOOLSLOW-W's control, E2's BURST arms are CUT-A's,
CUT-B's and SHED's; in the suite of every test, 15 simulations serve 47 runs (32 of them
copies: 78 s of the suite's 720 s of simulation). The simulator is deterministic, so a run whose every input is
another's has that run's records byte for byte; playing it again only costs time.

What makes two runs one simulation (`sim_key`): the engine backend 'sim' (a real engine is never
shared), the cell with its costs, the workload, the protocol, the arm's name and config, the gate
cap, the rate, the references, the seed and the top rate (the plan is a function of these), and the
backend options. The key is a SHA-256 over their canonical JSON, so a field added to any of these
configs takes part without being listed here.

What a shared run's folder holds (`clone_run`): the source run's plan and record tables, copied
(same bytes, so the same hashes in meta.json), and the source's meta.json with the fields that
name the test (runs.meta.IDENTITY_KEYS) set to its own test's, its own times, and
`shared_simulation` naming the source run and the key. Everything a verdict reads is then what a
simulation of its own would have written; `--simulate-each` plays every run anyway
(tests/pipeline/test_shared_sims.py compares both).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from harness.atomic import write_bytes_atomic
from harness.config import TestBundle
from harness.recording.record import dump_meta
from harness.recording.schema import RunStatus, read_meta
from runs.arms import PLAN_FILE, RunResult, find_arm, references
from runs.meta import IDENTITY_KEYS, identity_block

#: bump when something outside the key's inputs starts to change what a simulation records
KEY_VERSION = 1


def _plain(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    raise TypeError(f"cannot key {type(obj).__name__}")


def sim_key(
    bundle: TestBundle, arm: str, rate: float, seed: int, engine: str, options: Mapping[str, Any] | None
) -> str | None:
    """The key of the simulation this run is (None: not shared, a real engine or the emulator)."""
    if engine != "sim":
        return None
    name, cfg = find_arm(bundle, arm)
    doc = {
        "version": KEY_VERSION,
        "engine": engine,
        "cell": bundle.cell,
        "workload": bundle.workload,
        "protocol": bundle.protocol,
        "arm": name,
        "arm_config": cfg,
        "cap": cfg.gate_cap(bundle.test.cap),
        "rate": float(rate),
        "references": references(bundle),
        "seed": int(seed),
        "top_rate": bundle.test.top_rate,
        "options": dict(options or {}),
    }
    blob = orjson.dumps(doc, default=_plain, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return hashlib.sha256(blob).hexdigest()


def clone_run(src: RunResult, bundle: TestBundle, run_dir: Path | str, key: str) -> RunResult:
    """`run_dir` as a run of `bundle`'s test with the records of the completed run `src` (the same
    simulation: `sim_key` equal). Refuses a source that did not complete."""
    t0 = time.monotonic()
    if src.status != RunStatus.COMPLETED:
        raise ValueError(f"{src.run_dir}: {src.status}; only a completed run's records are shared")
    source, dst = Path(src.run_dir), Path(run_dir)
    meta = read_meta(source)
    if meta is None:
        raise ValueError(f"{source}: no readable meta.json to share")
    dst.mkdir(parents=True, exist_ok=True)
    if (dst / "meta.json").exists():
        raise FileExistsError(f"{dst} already holds a run (meta.json exists); use a fresh directory")
    names = [PLAN_FILE, *(t["file"] for t in meta["tables"].values())]
    for name in names:
        shutil.copyfile(source / name, dst / name)
    source_test = meta.get("test")
    test = bundle.test
    own = identity_block(
        test.name,
        str(bundle.path) if bundle.path else None,
        test.registration,
        test.rule,
        test.rule_params,
        test.references.source if test.references else None,
    )
    for k in IDENTITY_KEYS:
        meta.pop(k, None)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    meta.update(own)
    meta["created_at"] = meta["finished_at"] = now
    meta["shared_simulation"] = {
        "run": str(source),
        "test": source_test,
        "key": key,
        "wall_s": meta.get("wall_s"),
    }
    meta["wall_s"] = time.monotonic() - t0
    write_bytes_atomic(dst / "meta.json", dump_meta(meta), fsync=True)
    return RunResult(
        str(dst),
        src.arm,
        src.rate,
        src.seed,
        src.status,
        src.reason,
        float(meta["wall_s"]),
        src.plan_time,
        open_loop=src.open_loop,
        warnings=list(src.warnings),
        shared_from=str(source),
    )


__all__ = ["KEY_VERSION", "clone_run", "sim_key"]
