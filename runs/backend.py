"""Engine backends of the runner: what drives one run's client against an engine, by name.

"Engine" here is whatever serves the run's requests: the engine model in virtual time ('sim'), the
engine model behind HTTP in wall time ('emulator', 'emulator:sglang|vllm'), or a real engine server
('vllm', 'sglang'). The runner (runs/arms.py) is the same for every one: it freezes the plan,
builds the client and the recorder, and hands them to the backend `--engine NAME` names. 'sim' is
registered by runs/arms.py, the emulator and the real engines by runs/realrun.py, and a test may
register a stub of its own; none of them imports the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.client.contract import Client
from harness.client.openloop import PlanClient
from harness.config import ArmConfig, TestBundle
from harness.errors import ConfigError
from harness.recording.record import RunRecorder
from harness.recording.schema import RunStatus


class Watcher(Protocol):
    """Something that watches a run from inside (runs.arms.Observer): it wraps the client the driver plays."""

    def wrap(self, client: PlanClient) -> Client: ...


@dataclass
class RunContext:
    """What a backend needs to drive one run."""

    bundle: TestBundle
    arm: ArmConfig
    rate: float
    seed: int
    run_dir: Path
    client: PlanClient
    recorder: RunRecorder
    duration: float
    observer: Watcher | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class BackendResult:
    status: RunStatus  # COMPLETED | FAILED | INTERRUPTED
    reason: str | None
    end_time: float  # plan time at which the drive stopped
    meta: dict[str, Any] = field(default_factory=dict)  # engine facts for meta.json


Backend = Callable[[RunContext], BackendResult]
ENGINE_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, backend: Backend) -> None:
    """Make `--engine NAME` available (sim / vllm / sglang / emulator plug in here)."""
    ENGINE_BACKENDS[name] = backend


def get_backend(name: str) -> Backend:
    if name not in ENGINE_BACKENDS:
        raise ConfigError(f"--engine {name!r}: no such engine backend; available: {sorted(ENGINE_BACKENDS)}")
    return ENGINE_BACKENDS[name]
