"""The run's side of the speed pin (runs/realrun.py): where the search starts and what is recorded."""

from __future__ import annotations

import pytest

from harness.config import CellConfig, config_ref, load_config
from harness.servers.speedpin import Step


def test_a_run_s_pin_starts_where_its_options_say_and_records_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """EngineOptions.pin_start moves only the pin's first quota (CI's second arm starts at the first
    arm's pinned quota); without it the search starts at the cell's engine_cpu_quota. Either way the
    start is recorded beside the probes, and the pin still probes to the cell's speed."""
    import runs.realrun as rr
    from harness.servers.speedpin import PinResult

    cell = load_config(config_ref("vllm-cpu-tiny-65k-fp32", "cells"), CellConfig)
    assert cell.engine_cpu_quota == 1.2 and cell.engine_speed_pin is not None
    starts: list[float] = []

    def fake_pin(adapter, base_url, pin, start, model_name, set_quota):  # the search, recorded
        starts.append(start)
        return PinResult(True, 1.4, pin.token_rate, pin.token_rate, pin.tolerance, [Step(start, 1.0)])

    monkeypatch.setattr(rr, "pin_blocking", fake_pin)
    handle = type("H", (), {"cpu_group": "agentload-test", "log_path": None})()
    default = rr._pin_speed(None, handle, cell, "http://x", "m")
    moved = rr._pin_speed(None, handle, cell, "http://x", "m", 1.42)
    assert starts == [1.2, 1.42] and default is not None and moved is not None
    assert (default["start"], moved["start"]) == (1.2, 1.42) and moved["pinned"] and moved["applied"]
    assert rr.EngineOptions().pin_start is None  # the cell's quota unless a run is told otherwise
