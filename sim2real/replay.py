"""Replay a recorded run in the simulator: the run's own frozen plan, arm and cell, with a cost model.

The replay reads everything from the run directory (meta.json: cell, workload, protocol, arm,
cap; plan.parquet: the exact sessions it played), so it replays what was run, not what a config
says today; only the cost model may be swapped (`cost`: a fitted cost file). The result is a run
directory of its own, in the same format, beside a parity report (parity.py).

Which costs (`replay_costs`): a replay is only evidence about a run when its costs are the run's
engine's on the run's cell, so a cost file must name both (`engine`, `cells`) and one that names
another engine or cell is refused. A real run's meta.json carries its cell's configured costs,
which nothing ties to the engine that ran it (the CPU runs' meta held the A100 costs), so without
a cost file a real run is refused too, unless `cost_from_meta` says to use them anyway: the replay's
meta.json and the parity report then say so. A simulated or emulated run was made by the engine
model with its meta's costs: those are its own, and replay it as it was. A quota-scaled cost
(`cpu_quota`, sim2real/quota.py) plays each run at speed x the quota its record says it ran under
over the cost's, and the replay's meta.json records both (`replay_of.quota_scaling`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.client.openloop import arm_client
from harness.config import ArmConfig, CellConfig, CostConfig, ProtocolConfig, cost_file_owner, load_cost_file
from harness.drivers.virtual import simulate
from harness.errors import ConfigError
from harness.recording.record import RunRecorder
from harness.recording.schema import RunStatus
from harness.refengine.model import EngineModel
from harness.workload.planfile import read_plan
from provenance.meta import capture, sha256_file
from sim2real.quota import replay_speed_factor

PLAN_FILE = "plan.parquet"
MODEL_BACKENDS = ("sim", "emulator")  # runs the engine model made with their meta's costs


class ForeignCostError(ConfigError):
    """The costs offered for a replay do not belong to the run's engine and cell."""


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


def _fit_hint(run_dir: Path, cell: str) -> str:
    return (
        f"fit one with `agentload calibrate costs --cell {cell} --from-runs <this engine's runs on the cell> "
        f"--out DIR` and pass it as --cost, or pass --cost-from-meta to replay {run_dir} with the costs in its "
        "meta.json anyway (the parity report marks the replay)"
    )


def replay_costs(
    run_dir: Path, meta: dict[str, Any], cost_file: str | Path | None, cost_from_meta: bool = False
) -> tuple[CostConfig | None, dict[str, Any]]:
    """The costs a replay of `run_dir` uses (None: its meta's) and the record of where they came from
    (`source`: 'file', 'run' -- a simulated or emulated run's own -- or 'meta' -- asked for with
    cost_from_meta); raises ForeignCostError for costs that are not the run's engine's on its cell."""
    cell = meta.get("cell") or {}
    cell_name = str(cell.get("name"))
    engine = str((cell.get("engine") or {}).get("name"))
    backend = meta.get("engine_backend")
    if cost_file is not None and cost_from_meta:
        raise ConfigError("replay: give a cost file (--cost) or --cost-from-meta, not both")
    if cost_file is not None:
        owner_engine, owner_cells = cost_file_owner(cost_file)
        if owner_engine != engine or cell_name not in owner_cells:
            said = (
                "says neither which engine nor which cell it belongs to (no `engine:` / `cells:` fields)"
                if owner_engine is None and not owner_cells
                else f"says it is for engine {owner_engine}, cells {list(owner_cells)}"
            )
            raise ForeignCostError(
                f"{run_dir}: the run is on engine {engine}, cell {cell_name}; cost file {cost_file} {said}: "
                f"refused, a replay with another engine's or cell's costs says nothing of this run; "
                + _fit_hint(run_dir, cell_name)
            )
        return load_cost_file(cost_file), {
            "source": "file",
            "cost_file": str(cost_file),
            "cost_file_sha256": sha256_file(cost_file),
            "engine": owner_engine,
            "cells": list(owner_cells),
        }
    if backend in MODEL_BACKENDS:
        return None, {"source": "run", "cost_file": None, "cost_file_sha256": None}
    if not cost_from_meta:
        raise ForeignCostError(
            f"{run_dir}: a {backend} run on engine {engine}, cell {cell_name}, and no cost file: the costs in its "
            "meta.json are the cell's configured ones, which nothing ties to the engine that ran it; "
            + _fit_hint(run_dir, cell_name)
        )
    return None, {"source": "meta", "cost_file": None, "cost_file_sha256": None}


def replay_run(
    run_dir: Path | str,
    out_dir: Path | str,
    *,
    cost_file: str | Path | None = None,
    seed: int | None = None,
    cost_from_meta: bool = False,
    speed_factor: float = 1.0,
) -> Path:
    """Simulate `run_dir`'s plan, arm and cell (with `cost_file`'s costs, `replay_costs`) into `out_dir`;
    `speed_factor` moves the cost's speed (a flip margin's evaluations, sim2real/replay_margin.py)."""
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
    cost, cost_record = replay_costs(run_dir, meta, cost_file, cost_from_meta)
    if cost is not None:
        try:
            scaling = replay_speed_factor(meta, cost.cpu_quota, str(run_dir))
        except ValueError as exc:
            raise ForeignCostError(str(exc)) from None
        if scaling is not None:  # a quota-scaled cost: this run's engine had its own quota (sim2real/quota.py)
            # the factor is in the speed now: the replay's cell holds plain costs (the record keeps both quotas)
            cost = cost.model_copy(update={"speed": cost.speed * scaling["factor"], "cpu_quota": None})
            cost_record["quota_scaling"] = scaling
    cell = replay_cell(meta, cost)
    if speed_factor != 1.0:  # on the cell's costs, whichever they are (a file's or the run's own)
        cell = cell.model_copy(update={"cost": cell.cost.model_copy(update={"speed": cell.cost.speed * speed_factor})})
        cost_record["speed_factor"] = speed_factor
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
                "rule_params",
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
            **cost_record,
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
