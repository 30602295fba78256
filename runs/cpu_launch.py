"""How the CPU vLLM is launched for the scaled cells (configs/cells/vllm-cpu-*.yaml).

The cell fixes what the engine does (pool, blocks, running cap, chunk, context); these are the
launch settings beyond it that a CPU host needs, in one place for the calibration script
(benchmarks/cpu_trap.py), the CI test (tests/integration/test_cpu_trap.py) and a user's commands,
and on record in every run's meta.json (engine_launch.argv):

* `--enforce-eager`: no torch.compile; the server starts ~2x faster on a fresh machine (~23 s
  against ~60 s) and the calibration was made so (requests are ~1.5x slower than compiled);
* `--dtype bfloat16`: the tiny model's weights;
* `--kv-cache-memory-bytes`: CPU memory for the KV pool; the pool itself is the cell's
  (--num-gpu-blocks-override), this only has to hold it (131,072 tokens x 512 bytes = 64 MiB).

The engine's interpreter and the model come from AGENTLOAD_VLLM_PYTHON and AGENTLOAD_TINY_MODEL
(scripts/ci-engine-tests.sh --print-env sets both).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict
from typing import Any

from harness.errors import EngineError
from harness.servers.vllm import CPU_ENGINE_ARGS as ENGINE_ARGS
from harness.servers.vllm import VLLM_MODULE
from runs.realrun import EngineOptions

HEALTH_TIMEOUT = 600.0  # a loaded 2-core host has taken up to ~90 s to start the server


class LaunchError(EngineError):
    """The engine environment is not set up."""


def engine_env() -> tuple[str, str]:
    """(engine python, model directory) from the environment, or a LaunchError saying how to get them."""
    py, model = os.environ.get("AGENTLOAD_VLLM_PYTHON"), os.environ.get("AGENTLOAD_TINY_MODEL")
    if not py or not model:
        raise LaunchError(
            'AGENTLOAD_VLLM_PYTHON and AGENTLOAD_TINY_MODEL must be set: eval "$(scripts/ci-engine-tests.sh --print-env)"'
        )
    return py, model


def cli_options(python: str, model: str) -> list[str]:
    """The real-engine options of `agentload calibrate|run|test run` for the CPU vLLM."""
    out = [
        "--engine",
        "vllm",
        "--server-cmd",
        f"{shlex.quote(python)} -m {VLLM_MODULE}",
        "--model-path",
        model,
        "--health-timeout",
        f"{HEALTH_TIMEOUT:g}",
    ]
    return out + [f"--engine-arg={a}" for a in ENGINE_ARGS]


def run_options(python: str, model: str, **more: Any) -> dict[str, Any]:
    """The runner's options dict (RunContext.options) for the same launch, e.g. for execute_run."""
    opts = asdict(
        EngineOptions(
            engine="vllm",
            server_cmd=(python, "-m", VLLM_MODULE),
            model=model,
            extra_args=ENGINE_ARGS,
            health_timeout=HEALTH_TIMEOUT,
        )
    )
    opts.update(more)
    return opts
