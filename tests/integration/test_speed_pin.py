"""The engine speed pin on a real CPU vLLM (harness/servers/speedpin.py): the quota, searched on a
live server, makes the probe read the target, for targets 25% above and below what the host gives
at the starting quota (the stand-in for a slower and a faster host), and a host that cannot reach
the target at the largest allowed quota is refused, saying what it reached.

One server for the module (its start is 25-90 s on a 2-core machine), started under the cgroup
wrapper exactly as a run starts it (EngineAdapter.start: unthrottled until healthy); each case
calls the pin on it with another target. About 2-3 minutes in all.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import CellConfig, SpeedPin, config_ref, load_config
from harness.servers import cpuquota, free_port
from harness.servers.speedpin import SpeedPinError, measure_at, pin_speed
from harness.servers.vllm import VLLM_MODULE, VLLMAdapter

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900), pytest.mark.quiet, pytest.mark.wallclock]

START_QUOTA = 0.5
# 64 prompts of 640 tokens (~40,000 uncached tokens, 3-5 s a probe at half a CPU): with 16 (1 s a probe)
# successive probes at one quota read 30% apart on this machine, and the search could not settle.
SHAPE = {"requests": 64, "prompt_tokens": 640, "max_tokens": 4}


def _available() -> bool:
    try:
        cpuquota._controller_root()
        return True
    except cpuquota.QuotaError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = os.environ.get("AGENTLOAD_VLLM_PYTHON")
    model = os.environ.get("AGENTLOAD_TINY_MODEL")
    if not python or not model or not (Path(model) / "config.json").exists():
        pytest.skip("AGENTLOAD_VLLM_PYTHON and AGENTLOAD_TINY_MODEL are needed (scripts/ci-engine-tests.sh sets them)")
    if not _available():
        pytest.skip("no writable cgroup cpu controller: the quota (and so the pin) cannot be applied here")
    cell = load_config(config_ref("vllm-cpu-tiny-131k", "cells"), CellConfig).model_copy(
        update={"engine_cpu_quota": START_QUOTA}
    )
    adapter = VLLMAdapter(server_cmd=[python, "-m", VLLM_MODULE])
    port = free_port()
    argv, env = adapter.launch_command(cell, model=model, host="127.0.0.1", port=port)
    handle = adapter.start(argv, env, tmp_path_factory.mktemp("pin"), host="127.0.0.1", port=port, health_timeout=600)
    try:
        yield {
            "adapter": adapter,
            "handle": handle,
            "cell": cell,
            "url": handle.base_url,
            "name": adapter.served_model_name(cell),
            "set": lambda q: cpuquota.apply(handle.cpu_group, q),
        }
    finally:
        adapter.stop(handle)


def _rate_at_start(s: dict[str, Any]) -> float:
    probe = SpeedPin(token_rate=1.0, max_cpu_quota=1.5, source="test", **SHAPE)
    steps = asyncio.run(measure_at(s["adapter"], s["url"], probe, s["name"], [START_QUOTA], 2, s["set"]))
    return sum(x.token_rate for x in steps) / len(steps)


# The +-25% cases are at this machine's noise: in CI here the probe read 13,639 and then 17,643
# tokens/s at the same 0.5 CPU seconds apart (+29%), so a target 25% above "the host's speed" was
# met at the starting quota, and a second probe at a pinned quota read 10.5% off. They are skipped
# unless AGENTLOAD_SPEED_PIN_25=1 (docs/cpu-trap.md, "Showing the pin"); the refusal case runs always.
PIN_25_NOISY = (
    "the +-25% pin cases are within this host's probe noise (13,639 then 17,643 tokens/s at one quota, +29%): "
    "skipped unless AGENTLOAD_SPEED_PIN_25=1"
)


@pytest.mark.parametrize("factor", [1.25, 0.75], ids=["slower-host", "faster-host"])
def test_the_pin_reaches_a_target_25_percent_off_the_hosts_speed(server: dict[str, Any], factor: float) -> None:
    if os.environ.get("AGENTLOAD_SPEED_PIN_25") != "1":
        pytest.skip(PIN_25_NOISY)
    base = _rate_at_start(server)
    pin = SpeedPin(
        token_rate=base * factor, tolerance=0.05, max_cpu_quota=1.5, min_cpu_quota=0.1, source="test", **SHAPE
    )
    res = asyncio.run(pin_speed(server["adapter"], server["url"], pin, START_QUOTA, server["name"], server["set"]))
    print(
        f"\nhost at {START_QUOTA} CPU: {base:.0f} tokens/s; "
        f"target {pin.token_rate:.0f}: pinned at {res.quota:.3f} CPU, "
        f"{res.token_rate:.0f} tokens/s in {len(res.steps)} probe(s), {res.seconds:.1f} s; steps "
        + ", ".join(f"{s.quota:.3f}: {s.token_rate:.0f}" for s in res.steps)
    )
    assert res.pinned and res.flushed and abs(res.token_rate / pin.token_rate - 1) <= pin.tolerance
    assert (res.quota > START_QUOTA) == (factor > 1)  # a faster target needs more CPU, a slower one less
    assert cpuquota.quota_of(_group(server)) == pytest.approx(
        res.quota, rel=1e-3
    )  # the kernel enforces the pinned quota
    again = asyncio.run(
        measure_at(server["adapter"], server["url"], pin, server["name"], [res.quota], 1, server["set"])
    )[0]
    assert abs(again.token_rate / pin.token_rate - 1) <= 2 * pin.tolerance, (
        "the pinned speed does not hold on a second probe"
    )


def _group(s: dict[str, Any]) -> Path:
    root, _ = cpuquota._controller_root()
    return root / "agentload" / s["handle"].cpu_group


def test_a_host_too_slow_for_the_target_is_refused_with_what_it_reached(server: dict[str, Any]) -> None:
    base = _rate_at_start(server)
    pin = SpeedPin(
        token_rate=base * 50, tolerance=0.05, max_cpu_quota=0.8, min_cpu_quota=0.1, max_steps=3, source="test", **SHAPE
    )
    with pytest.raises(SpeedPinError) as info:
        asyncio.run(pin_speed(server["adapter"], server["url"], pin, START_QUOTA, server["name"], server["set"]))
    msg = str(info.value)
    assert "host too slow" in msg and "0.8 CPU" in msg and info.value.reason == "speed_pin"
    # 50x its speed is out of reach even at the fastest growth the search trusts (quota^1.5 from 0.5
    # to 0.8 CPU gives 2x): the second probe, at the largest quota, confirms it, and the refusal says
    # what both read
    steps = info.value.record["steps"]
    assert [s["quota"] for s in steps] == pytest.approx([START_QUOTA, 0.8]) and "at most" in msg, msg
    assert all(f"{s['token_rate']:.0f} uncached tokens/s" in msg for s in steps)
