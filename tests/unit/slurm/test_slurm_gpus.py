"""What GPUs a job was given (slurm/gpus.py), recorded by every job, and the job's refusal of a GPU
cell's real-engine run without one, in-process on a fixture repository (no cluster, no GPU). The
same on the local cluster, whose GPUs are placeholder nodes: tests/integration/test_slurm_gpu.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.slurm_fixture import commit, fill, make_project

from harness.config import CONFIG_ROOT, CellConfig, load_config
from prereg.registration import load_registration
from slurm import job as J
from slurm.gpus import device_list, gpu_facts, gpu_refusal, gres_gpus, host_gpus, needs_gpu
from slurm.scheduler import CommandResult


def _cell(name: str) -> CellConfig:
    return load_config(CONFIG_ROOT / "cells" / f"{name}.yaml", CellConfig)


def test_gres_strings_and_device_lists() -> None:
    assert [
        gres_gpus(t)
        for t in ("gres:gpu:1", "gres/gpu=2", "gpu:a100:4(S:0-1)", "gpu:2,shard:4", "N/A", "(null)", "", None)
    ] == [1, 2, 4, 2, 0, 0, 0, 0]
    assert gres_gpus("gpu:1080:2") == 2  # a numeric type name is not the count
    assert (
        device_list("NoDevFiles") == []
        and device_list("0,1") == ["0", "1"]
        and device_list(None) is None
        and device_list("-1") == []
    )


def test_host_gpus_counts_the_driver_s_devices(tmp_path: Path) -> None:
    assert host_gpus(tmp_path / "absent") == 0
    for i in range(2):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert host_gpus(tmp_path) == 2


def _runner(answers: Mapping[str, str]) -> Any:
    def run(argv: Sequence[str], _env: Mapping[str, str]) -> CommandResult:
        return CommandResult(0, answers.get(argv[0], ""), "")

    return run


def test_gpu_facts_in_a_slurm_job_read_the_allocation(tmp_path: Path) -> None:
    facts = {"in_slurm": True, "job_label": "7", "node": "n1"}
    node = "NodeName=n1 Arch=x86_64 CoresPerSocket=2 Gres=gpu:2 NodeAddr=127.0.0.1 State=IDLE"
    given = gpu_facts(
        facts,
        env={"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "", "SLURM_GPUS_ON_NODE": "1"},
        runner=_runner({"squeue": "gres:gpu:1\n", "scontrol": node}),
        nvidia_root=tmp_path,
    )
    assert (
        given["given"] == 1
        and given["node_gpus"] == 2
        and given["job_gres"] == "gres:gpu:1"
        and given["visible_devices"] == []
    )
    assert given["env"] == {"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "", "SLURM_GPUS_ON_NODE": "1"}
    none = gpu_facts(facts, env={}, runner=_runner({"squeue": "N/A\n", "scontrol": node}), nvidia_root=tmp_path)
    assert none["given"] == 0 and none["node_gpus"] == 2
    assert gpu_refusal(_cell("sglang-a100-300k"), "sglang", none).startswith(
        "cell sglang-a100-300k runs sglang on a GPU (A100 80GB PCIe)"
    )
    assert "--gres gpu:1" in gpu_refusal(_cell("sglang-a100-300k"), "sglang", none)
    assert gpu_refusal(_cell("sglang-a100-300k"), "sglang", given) is None


def test_gpu_facts_outside_slurm_read_the_host(tmp_path: Path) -> None:
    (tmp_path / "0000:01:00.0").mkdir()
    assert gpu_facts({"in_slurm": False}, env={}, nvidia_root=tmp_path)["given"] == 1
    assert gpu_facts({"in_slurm": False}, env={"CUDA_VISIBLE_DEVICES": ""}, nvidia_root=tmp_path)["given"] == 0
    off = gpu_facts({"in_slurm": False}, env={}, nvidia_root=tmp_path / "none")
    assert off["given"] == 0 and "host shows no GPU" in gpu_refusal(_cell("vllm-a100-300k"), "vllm", off)


def test_which_runs_need_a_gpu() -> None:
    assert needs_gpu(_cell("sglang-h200-300k"), "sglang") and needs_gpu(_cell("vllm-a100-300k"), "vllm")
    assert not needs_gpu(_cell("sglang-a100-300k"), "emulator") and not needs_gpu(_cell("sglang-a100-300k"), "sim")
    assert not needs_gpu(_cell("vllm-cpu-tiny-131k"), "vllm") and not needs_gpu(_cell("sglang-cpu-tiny-32k"), "sglang")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("slurm-gpus")
    work, _remote = make_project(tmp)
    reg = fill(work, "gpu-one", seeds="[3]", arms="[noburst]")
    return {"work": work, "reg": reg, "commit": commit(work, "register gpu-one", push=True)}


def _spec(p: dict[str, Any], run_dir: Path, engine: str) -> J.JobSpec:
    reg = load_registration(p["reg"])
    return J.JobSpec(
        registration="prereg/registrations/gpu-one.yaml",
        sha256=reg.sha256,
        arm="noburst",
        rate=1.75,
        seed=3,
        run_dir=str(run_dir),
        engine=engine,
        commit=p["commit"],
    )


def test_a_gpu_cell_without_a_gpu_is_refused_before_any_engine_starts(
    project: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("slurm.gpus.host_gpus", lambda *_a: 0)  # whatever GPUs this host has
    out = J.run_job(_spec(project, tmp_path / "run", "sglang"), code_root=project["work"])
    assert out.status == "REFUSED" and out.check == "gpu" and out.exit_code == J.JobExit.REFUSED, out
    meta = orjson.loads((tmp_path / "run" / "meta.json").read_bytes())
    assert meta["refusal"]["check"] == "gpu" and "runs sglang on a GPU (A100 80GB PCIe)" in meta["status_reason"]
    assert meta["job"]["gpus"]["given"] == 0 and "engine_launch" not in meta  # nothing was launched
    ok = J.run_job(_spec(project, tmp_path / "sim", "sim"), code_root=project["work"])  # the simulator needs none
    assert ok.status == "COMPLETED", ok
    assert orjson.loads((tmp_path / "sim" / "meta.json").read_bytes())["job"]["gpus"]["given"] == 0
