"""Starting an engine on a free port: a port taken between finding it free and starting on it is
tried again on another, a port the caller chose is not, and any other failed start is final."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.config import CellConfig
from harness.servers.base import EngineAdapter, EngineStartError, ServerHandle
from harness.servers.portstart import start_on_free_port


class _Adapter(EngineAdapter):
    """Fails the first starts with the given reasons, then comes up; remembers every start."""

    name = "fake"

    def __init__(self, failures: Sequence[str]) -> None:
        super().__init__()
        self.failures = list(failures)
        self.started: list[tuple[int, dict[str, str]]] = []

    def launch_command(
        self, cell: CellConfig, *, model: str, host: str, port: int, extra_args: Sequence[str] = ()
    ) -> tuple[list[str], dict[str, str]]:
        return ["engine", "--port", str(port), *extra_args], {"OWN": "1"}

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], run_dir: Path, *, host: str, port: int, health_timeout: float
    ) -> ServerHandle:
        self.started.append((port, dict(env)))
        if self.failures:
            raise EngineStartError(self.failures.pop(0), f"start on port {port} failed")
        return ServerHandle(base_url=f"http://{host}:{port}", process=None, log_path=None)

    async def flush_cache(self, http: Any, base_url: str, *, timeout: float = 60.0) -> None:
        raise NotImplementedError  # not used here


def _start(adapter: _Adapter, **kw: Any) -> tuple[ServerHandle, list[str]]:
    ports = iter(range(41000, 41010))
    return start_on_free_port(
        adapter,
        None,
        Path("/nonexistent"),
        model="m",
        host="127.0.0.1",
        health_timeout=1.0,  # type: ignore[arg-type]
        pick_port=lambda: next(ports),
        **kw,
    )


def test_a_taken_port_is_started_again_on_another_and_each_start_is_on_record() -> None:
    adapter = _Adapter(["port_in_use"])
    launched: list[tuple[list[str], int]] = []
    handle, argv = _start(
        adapter, extra_args=["--x"], env={"ADDED": "2"}, on_launch=lambda a, e, p: launched.append((a, p))
    )
    assert adapter.started[-1][0] == 41001 and handle.base_url.endswith(":41001")
    assert argv == ["engine", "--port", "41001", "--x"]
    assert [p for _, p in launched] == [41000, 41001]  # the record's last start is the one that ran
    assert adapter.started[-1][1] == {"OWN": "1", "ADDED": "2"}  # the caller's environment on top of the engine's


def test_every_try_taken_fails_with_port_in_use() -> None:
    adapter = _Adapter(["port_in_use"] * 5)
    with pytest.raises(EngineStartError) as info:
        _start(adapter, tries=3)
    assert info.value.reason == "port_in_use" and len(adapter.started) == 3


@pytest.mark.parametrize("reason", ["exited", "never_healthy"])
def test_any_other_failed_start_is_final(reason: str) -> None:
    adapter = _Adapter([reason])
    with pytest.raises(EngineStartError):
        _start(adapter)
    assert len(adapter.started) == 1


def test_a_port_the_caller_chose_is_not_swapped_for_another() -> None:
    adapter = _Adapter(["port_in_use"])
    with pytest.raises(EngineStartError):
        _start(adapter, port=5555)
    assert [p for p, _ in adapter.started] == [5555]


def test_tries_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tries must be >= 1"):
        _start(_Adapter([]), tries=0)
