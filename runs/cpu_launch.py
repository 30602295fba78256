"""How the CPU vLLM is reached for the scaled cells (configs/cells/vllm-cpu-*.yaml): the engine's
interpreter and the model, which differ between machines and so come from the environment.

What the engine does and the launch settings a CPU host needs (eager, bf16, the KV pool's memory)
are the cell's own (`launch_extras`, applied by the adapter and recorded in every run's meta.json
as engine_launch.argv), so `calibrate`, `run`, `test run` and `submit` need no `--engine-arg`. What
is left here is in one place for the calibration script (benchmarks/cpu_trap.py), the CI test
(tests/integration/test_cpu_trap.py) and a user's commands: AGENTLOAD_VLLM_PYTHON and
AGENTLOAD_TINY_MODEL (scripts/ci-engine-tests.sh --print-env sets both) and the start deadline.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict
from typing import Any

from harness.errors import EngineError
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
            'AGENTLOAD_VLLM_PYTHON and AGENTLOAD_TINY_MODEL must be set: eval "$(scripts/ci-engine-tests.sh '
            '--print-env)"'
        )
    return py, model


def cli_options(python: str, model: str) -> list[str]:
    """The real-engine options of `agentload calibrate|run|test run` for the CPU vLLM."""
    return [
        "--engine",
        "vllm",
        "--server-cmd",
        f"{shlex.quote(python)} -m {VLLM_MODULE}",
        "--model-path",
        model,
        "--health-timeout",
        f"{HEALTH_TIMEOUT:g}",
    ]


def run_options(python: str, model: str, **more: Any) -> dict[str, Any]:
    """The runner's options dict (RunContext.options) for the same launch, e.g. for execute_run."""
    opts = asdict(
        EngineOptions(engine="vllm", server_cmd=(python, "-m", VLLM_MODULE), model=model, health_timeout=HEALTH_TIMEOUT)
    )
    opts.update(more)
    return opts
