"""The GPUs a job was given, and the refusal of a GPU cell's real-engine run without one.

Why in the job: a GPU cell (an A100 or H200 one) launched where there is no GPU dies inside the
engine minutes after it was scheduled, with a CUDA error deep in a server log; the job can tell
before anything starts, and say what to do (submit with `--gres gpu:1`). And a reviewer reading a
run's meta.json should see what the job was given, not only what it asked for: the scheduler's
variables (SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES), the job's gres as the
controller lists it (`squeue -o %b`), the node's GPU count as the controller knows it
(`scontrol show node -o`, Gres=) and the devices this host's NVIDIA driver lists
(/proc/driver/nvidia/gpus).

A GPU is "given" in a SLURM job when the scheduler allocated a gpu gres (its variables or the
job's gres say so), and outside SLURM when the host shows a device that CUDA_VISIBLE_DEVICES does
not hide. In SLURM the allocation is what counts, not the devices: the local test cluster's GPUs
are placeholder nodes (slurm/local/cluster.sh), and a generic resource without device files makes
Slurm set CUDA_VISIBLE_DEVICES=NoDevFiles, which names no device; the job was given its GPU all
the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.config import CellConfig
from slurm.scheduler import Runner, SchedulerError, run_command

GPU_ENV = (
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)
NO_DEVICE = frozenset({"", "NoDevFiles", "-1", "none", "N/A"})
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
REAL_ENGINES = ("sglang", "vllm")
#: GPUs a GPU cell's job uses when no gres says otherwise: every GPU cell of the project is one device
#: (one A100 80GB, one H200 NVL).
GPUS_PER_JOB = 1
_GRES_GPU = re.compile(r"(?:^|[,\s])(?:gres[:/])?gpu(?::[A-Za-z0-9_.-]+)*?[:=](\d+)(?=$|[(,\s])")


def gres_gpus(text: str | None) -> int:
    """GPUs in a gres / TRES string: 'gres:gpu:1', 'gres/gpu=2', 'gpu:a100:4(S:0-1)', 'gpu:2,shard:4';
    0 for 'N/A', '(null)', empty."""
    if not text:
        return 0
    return sum(int(m.group(1)) for m in _GRES_GPU.finditer(text.strip()))


def device_list(value: str | None) -> list[str] | None:
    """The devices a CUDA_VISIBLE_DEVICES-style list names; None when unset, [] when it names none
    ('NoDevFiles': Slurm's value for a gres without device files)."""
    if value is None:
        return None
    if value.strip() in NO_DEVICE:
        return []
    return [x.strip() for x in value.split(",") if x.strip()]


def host_gpus(root: Path = NVIDIA_GPUS) -> int:
    """The GPUs this host's NVIDIA driver lists (0 without a driver)."""
    try:
        return sum(1 for p in root.iterdir() if p.is_dir())
    except OSError:
        return 0


def _ask(argv: list[str], runner: Runner | None) -> str | None:
    try:
        res = (runner or run_command)(argv, {})
    except (FileNotFoundError, SchedulerError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def gpu_facts(facts: Mapping[str, Any], *, env: Mapping[str, str] | None = None, runner: Runner | None = None,
              nvidia_root: Path = NVIDIA_GPUS) -> dict[str, Any]:  # fmt: skip
    """What GPUs the job has: `facts` is the job's scheduler facts as JSON
    (slurm.checks.SchedulerFacts.to_json(): in_slurm, job_label, node)."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {"env": {k: env[k] for k in GPU_ENV if k in env}, "host_gpus": host_gpus(nvidia_root)}
    visible = device_list(env.get("CUDA_VISIBLE_DEVICES"))
    if facts.get("in_slurm"):
        job = facts.get("job_label") or facts.get("job_id")
        node = facts.get("node")
        out["job_gres"] = _ask(["squeue", "--noheader", f"--jobs={job}", "--format=%b"], runner) if job else None
        line = _ask(["scontrol", "--oneliner", "show", "node", str(node)], runner) if node else None
        m = re.search(r"(?:^|\s)Gres=(\S*)", line or "")
        out["node_gres"] = m.group(1) if m else None
        out["node_gpus"] = gres_gpus(out["node_gres"]) if m else None
        from_env = [int(env[k]) for k in ("SLURM_GPUS_ON_NODE",) if env.get(k, "").isdigit()]
        listed = device_list(env.get("SLURM_JOB_GPUS"))
        given = max([*from_env, len(listed or []), gres_gpus(out["job_gres"])])
        out["source"] = "the scheduler's allocation (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, squeue %b)"
    else:
        given = out["host_gpus"] if visible is None else min(len(visible), out["host_gpus"])
        out["source"] = "this host's NVIDIA driver (/proc/driver/nvidia/gpus), less what CUDA_VISIBLE_DEVICES hides"
    out["visible_devices"] = visible
    out["given"] = given
    return out


def needs_gpu(cell: CellConfig, engine: str) -> bool:
    """A real engine serving a cell that runs on a GPU: not a CPU cell (gpu 'cpu ...', device 'cpu'),
    and not the simulator or the emulator, which run anywhere."""
    if engine.partition(":")[0] not in REAL_ENGINES:
        return False
    return not (cell.gpu.strip().lower().startswith("cpu") or (cell.device or "").lower() == "cpu")


def gpu_refusal(cell: CellConfig, engine: str, gpus: Mapping[str, Any]) -> str | None:
    """The reason to refuse the run, or None: a GPU cell on a real engine with no GPU given."""
    if not needs_gpu(cell, engine) or gpus.get("given", 0) > 0:
        return None
    where = (
        "this job was allocated no GPU (no gpu gres: submit with --gres gpu:1)"
        if "job_gres" in gpus
        else "this host shows no GPU (no /proc/driver/nvidia/gpus device, or CUDA_VISIBLE_DEVICES hides them)"
    )
    return f"cell {cell.name} runs {engine} on a GPU ({cell.gpu}) and {where}; the engine would fail at start"
