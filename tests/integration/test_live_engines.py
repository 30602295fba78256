"""The test session's server pool itself (live_engines.py): a start whose port was taken between
finding it free and starting on it goes to another port; any other failed start is final."""

from __future__ import annotations

import socket
from pathlib import Path

import live_engines
import pytest

from harness.servers import EngineStartError, free_port


def test_a_taken_port_is_started_again_on_another(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy, free_port()])
        monkeypatch.setattr(live_engines, "free_port", lambda: next(ports))
        live = live_engines.launch(live_engines.plan_launch("emulator:vllm", tmp_path / "e", "emulator:vllm", None))
        try:
            assert live.port != busy and live.alive()
        finally:
            live.adapter.stop(live.handle)


def test_a_port_taken_at_every_try_fails_the_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(live_engines, "free_port", lambda: busy)
        with pytest.raises(EngineStartError) as info:
            live_engines.launch(live_engines.plan_launch("emulator:vllm", tmp_path / "e", "emulator:vllm", None))
    assert info.value.reason == "port_in_use" and str(busy) in str(info.value)


def test_servers_left_running_are_stopped_at_exit(tmp_path: Path) -> None:
    # what atexit runs when the session ends without closing its pool (pytest's INTERNALERROR)
    pool = live_engines.EnginePool(tmp_path)
    try:
        live = pool.get("emulator:vllm")
        assert live.alive()
        pool._stop_left_at_exit()
        assert not live.alive() and not pool.servers
        assert not live_engines.port_holders(live.port)  # nothing of the server is left on its port
    finally:
        pool.close()  # idempotent: nothing left to stop
