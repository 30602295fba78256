"""Replay a recorded run in the simulator: the run's own frozen plan, arm and cell, with a cost model.

The replay reads everything from the run directory (meta.json: cell, workload, protocol, arm,
cap; plan.parquet: the exact sessions it played), so it replays what was run, not what a config
says today; only the cost model may be swapped (`cost`: a fitted cost file). The result is a run
directory of its own, in the same format, beside a parity report (parity.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.client.openloop import arm_client
from harness.config import ArmConfig, CellConfig, CostConfig, ProtocolConfig, load_cost_file
from harness.drivers.virtual import simulate
from harness.errors import ConfigError
from harness.recording.record import RunRecorder
from harness.recording.schema import RunStatus
from harness.refengine.model import EngineModel
from harness.workload.planfile import read_plan
from provenance.meta import capture, sha256_file

PLAN_FILE = "plan.parquet"


def _meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "meta.json"
    if not path.exists():
        raise ConfigError(f"{run_dir}: no meta.json (not a run directory)")
    meta: dict[str, Any] = json.loads(path.read_text())
    return meta


def replay_cell(meta: dict[str, Any], cost: CostConfig | None) -> CellConfig:
    """The run's cell, with `cost` in place of its own cost model when given."""
    data = dict(meta["cell"])
    data.pop("cost_file", None)  # the dumped cell carries its parameters inline
    if cost is not None:
        data["cost"] = cost.model_dump()
    return CellConfig.model_validate(data)


def replay_run(
    run_dir: Path | str, out_dir: Path | str, *, cost_file: str | Path | None = None, seed: int | None = None
) -> Path:
    """Simulate `run_dir`'s plan, arm and cell (with `cost_file`'s costs) into `out_dir`."""
    run_dir = Path(run_dir)
    meta = _meta(run_dir)
    for key in ("cell", "protocol", "arm_config"):
        if not meta.get(key):
            raise ConfigError(
                f"{run_dir}/meta.json: missing {key!r}; only runs made by `agentload run`/`test run` can be replayed"
            )
    plan_path = run_dir / PLAN_FILE
    if not plan_path.exists():
        raise ConfigError(f"{run_dir}: no {PLAN_FILE}; the run's frozen plan is what a replay plays")
    plan = read_plan(plan_path)
    want = (meta.get("plan") or {}).get("sha256")
    if want and plan.sha256 != want:
        raise ConfigError(f"{plan_path}: SHA-256 {plan.sha256} differs from the {want} the run recorded")
    cost = load_cost_file(cost_file) if cost_file else None
    cell = replay_cell(meta, cost)
    arm = ArmConfig.model_validate(meta["arm_config"])
    protocol = ProtocolConfig.model_validate(meta["protocol"])
    cap = meta.get("cap")
    out_dir = Path(out_dir)
    if (out_dir / "meta.json").exists():
        raise ConfigError(f"{out_dir}: already holds a run")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / PLAN_FILE).write_bytes(plan_path.read_bytes())
    duration = float(meta.get("end_time") or protocol.duration)
    rmeta = {
        **{
            k: meta.get(k)
            for k in (
                "test",
                "registration",
                "rule",
                "arm",
                "rate",
                "rate_abs",
                "seed",
                "references",
                "cap",
                "workload",
            )
        },
        "arm_config": arm,
        "cell": cell,
        "protocol": protocol,
        "plan": meta.get("plan"),
        "engine_backend": "sim",
        "replay_of": {
            "run_dir": str(run_dir),
            "engine_backend": meta.get("engine_backend"),
            "status": meta.get("status"),
            "cost_file": str(cost_file) if cost_file else None,
            "cost_file_sha256": sha256_file(cost_file) if cost_file else None,
        },
        "provenance": capture(include_gpu=False),
    }
    t0 = time.monotonic()
    with RunRecorder(out_dir, rmeta) as rec:
        client = arm_client(plan.sessions, plan.workload, arm, cap, rec)
        engine = EngineModel(cell, seed=int(meta.get("seed", 0) if seed is None else seed))
        res = simulate(client, engine, recorder=rec, until=duration, gauge_interval=protocol.gauge_interval)
        client.close(float(res.end_time))
        rec.update_meta(
            {
                "simulation": res.as_meta(),
                "client": client.counters(),
                "end_time": float(res.end_time),
                "wall_s": time.monotonic() - t0,
            }
        )
        rec.close(RunStatus.COMPLETED)
    return out_dir
