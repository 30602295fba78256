"""runs/host_scale.py: the measuring path reproduces the registered measurement, and refuses what
it cannot use. The engine model in virtual time stands in for the host (no engine here): at the
registered population and seed its closed cache-off run is the calibration's own seed-0 E0a run,
so its scale is that run's token rate over the registered mean, exactly."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from support.paths import REPO

from prereg.registration import load_registration
from runs import host_scale
from runs.host_scale import HostScaleError, measure_host_scale, registered_e0a_protocol

REG = REPO / "prereg" / "registrations" / "sim-e2-sglang-a100-300k.yaml"
E0A = REPO / "prereg" / "inputs" / "sim-sglang-a100-300k" / "e0a.yaml"


def test_the_protocol_is_the_bound_e0a_inputs() -> None:
    p = yaml.safe_load(E0A.read_text())["protocol"]
    assert registered_e0a_protocol(load_registration(REG)) == {
        "warmup_s": p["warmup_s"], "window_s": p["window_s"], "n": p["n"]
    }  # fmt: skip


def test_the_engine_model_at_the_registered_population_is_its_own_calibration(tmp_path: Path) -> None:
    e0a = yaml.safe_load(E0A.read_text())
    seed0 = next(r for r in e0a["per_seed"] if r["seed"] == 0)
    hs = measure_host_scale(load_registration(REG), None, tmp_path / "hs", population_factor=1)
    assert hs.n == e0a["protocol"]["n"]
    assert hs.host_token_rate == pytest.approx(seed0["uncached_token_rate"], rel=1e-9)
    assert hs.scale == pytest.approx(seed0["uncached_token_rate"] / e0a["all_miss_token_rate"], rel=1e-9)
    assert (tmp_path / "hs" / "meta.json").exists()  # the measurement leaves its records


def test_a_host_much_slower_than_the_calibrating_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = load_registration(REG)
    slow = reg.references.all_miss_token_rate * (host_scale.MIN_SCALE / 2)
    monkeypatch.setattr(
        host_scale, "run_closed", lambda *a, **k: SimpleNamespace(stats=SimpleNamespace(uncached_token_rate=slow))
    )
    with pytest.raises(
        HostScaleError, match="slower than the calibrating one; run on a faster host or re-calibrate here"
    ):
        measure_host_scale(reg, None, tmp_path)


def test_a_registration_without_an_e0a_input_is_refused() -> None:
    reg = load_registration(REG)
    no_e0a = reg.model_copy(update={"inputs": [i for i in reg.inputs if i.role != "e0a"]})
    with pytest.raises(HostScaleError, match="no bound input of stage e0a"):
        registered_e0a_protocol(no_e0a)
