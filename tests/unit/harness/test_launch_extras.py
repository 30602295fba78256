"""A cell carries its own launch extras (CellConfig.launch_extras): strictly validated, applied by
the adapters after the cell's flags and before a command's --engine-arg, refused where they repeat
a flag the cell sets, ignored by the emulator, and left out of a registration while unset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO

from harness.config import CellConfig, load_config
from harness.errors import ConfigError
from harness.servers import get_adapter
from harness.servers.vllm import ENGINE_CACHE_ENV
from prereg.registration import load_registration, registration_dict

CPU_EXTRAS = ["--enforce-eager", "--dtype", "bfloat16", "--kv-cache-memory-bytes", "268435456"]
CPU_EXTRAS_FP32 = [x if x != "bfloat16" else "float32" for x in CPU_EXTRAS]


@pytest.fixture(autouse=True)
def _no_engine_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINE_CACHE_ENV, raising=False)


def _cell(**update: Any) -> CellConfig:
    return load_config("cells/vllm-cpu-tiny-131k", CellConfig).model_copy(update=update)


def _write(tmp_path: Path, extras: Any) -> Path:
    data = load_config("cells/vllm-cpu-tiny-131k", CellConfig).model_dump(mode="json")
    data["launch_extras"] = extras
    p = tmp_path / "cell.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_the_cpu_vllm_cells_carry_what_the_cpu_needs() -> None:
    cpu_vllm = []
    for p in sorted((REPO / "configs" / "cells").glob("*.yaml")):
        cell = load_config(p, CellConfig)
        if not cell.gpu.lower().startswith("cpu"):
            assert cell.launch_extras is None, p.name  # a GPU cell launches from its fields alone
        elif cell.engine.name == "vllm":
            # without them vLLM's CPU backend reserves 92% of the host's memory and refuses to start on a
            # host where anything else holds 8% (the first submission of e2-vllm-cpu-tiny-65k-quarter)
            # (the dtype is the cell's: bf16 on the AVX-512 host's cells, fp32 on the one made for any host)
            assert cell.launch_extras in (CPU_EXTRAS, CPU_EXTRAS_FP32), p.name
            cpu_vllm.append(p.stem)
    assert {"vllm-cpu-tiny-131k", "vllm-cpu-tiny-65k", "vllm-cpu-tiny-65k-fit2", "vllm-cpu-tiny-65k-fp32"} <= set(
        cpu_vllm
    )


@pytest.mark.parametrize(
    "extras,match",
    [
        ([], r"launch_extras: got \[\]; expected .*at least 1 item"),
        (["--dtype", " bfloat16"], r"launch_extras\[1\] to be one engine argument without surrounding whitespace"),
        (["--dtype", ""], r"launch_extras\[1\] to be one engine argument"),
        (["bfloat16", "--dtype"], r"launch_extras to start with a flag \(--name\), got 'bfloat16'"),
        (["--kv-cache-memory-bytes", 268435456], r"launch_extras\[1\]: got 268435456; expected a valid string"),
        ("--enforce-eager", r"launch_extras: got '--enforce-eager'; expected a valid list"),
    ],
)
def test_launch_extras_are_validated_strictly(tmp_path: Path, extras: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, extras), CellConfig)


def test_vllm_applies_the_cells_extras_before_the_commands() -> None:
    cell = _cell()
    a = get_adapter("vllm", cell=cell, server_cmd=["py", "-m", "vllm.entrypoints.openai.api_server"])
    argv, _ = a.launch_command(cell, model="tiny", host="127.0.0.1", port=8000, extra_args=["--seed", "1"])
    i = argv.index("--enable-per-request-metrics")  # the last flag the cell's fields set
    assert argv[i + 1 : i + 1 + len(CPU_EXTRAS)] == CPU_EXTRAS and argv[-2:] == ["--seed", "1"]
    bare, _ = a.launch_command(_cell(launch_extras=None), model="tiny", host="127.0.0.1", port=8000)
    assert bare == [x for x in argv if x not in (*CPU_EXTRAS, "--seed", "1")]


def test_sglang_applies_the_cells_extras() -> None:
    cell = load_config("cells/sglang-cpu-tiny-32k", CellConfig).model_copy(
        update={"launch_extras": ["--sleep-on-idle"]}
    )
    argv, _ = get_adapter("sglang", cell=cell, server_cmd=["py", "-m", "sglang.launch_server"]).launch_command(
        cell, model="tiny", host="127.0.0.1", port=8000, extra_args=["--log-level", "warning"]
    )
    assert argv[-3:] == ["--sleep-on-idle", "--log-level", "warning"]


@pytest.mark.parametrize(
    "extra", [["--block-size", "16"], ["--max-num-seqs=8"], ["--no-enable-prefix-caching"], ["--enable-prefix-caching"]]
)
def test_an_extra_that_repeats_a_flag_of_the_cell_is_refused(extra: list[str]) -> None:
    cell = _cell(launch_extras=["--dtype", "bfloat16", *extra])
    a = get_adapter("vllm", cell=cell, server_cmd=["py", "-m", "vllm.entrypoints.openai.api_server"])
    with pytest.raises(ConfigError, match=rf"cell vllm-cpu-tiny-131k: launch_extras: got '{extra[0]}', a flag the"):
        a.launch_command(cell, model="tiny", host="127.0.0.1", port=8000)


def test_the_emulator_ignores_the_engines_extras(tmp_path: Path) -> None:
    cell = _cell()
    argv, _ = get_adapter("emulator", cell=cell, cell_ref=str(tmp_path / "c.yaml")).launch_command(
        cell, model="tiny", host="127.0.0.1", port=8000
    )
    assert not set(CPU_EXTRAS) & set(argv)


def test_a_registration_writes_the_extras_only_when_set() -> None:
    cpu = load_registration(REPO / "prereg" / "registrations" / "e2-vllm-cpu-tiny-131k.yaml")
    assert cpu.cell.launch_extras == CPU_EXTRAS and registration_dict(cpu)["cell"]["launch_extras"] == CPU_EXTRAS
    gpu = load_registration(REPO / "prereg" / "registrations" / "e2-vllm-a100-300k.yaml")
    assert gpu.cell.launch_extras is None and "launch_extras" not in registration_dict(gpu)["cell"]
    assert "launch_extras" not in gpu.raw.decode()  # a registration from before the field keeps its bytes
