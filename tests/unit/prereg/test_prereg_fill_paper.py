"""The paper's registrations, refilled from its printed calibration inputs (prereg/inputs/paper/).

The expected numbers are the paper's (App. E.5, E.11, Table 14; rules digest §1.9), typed here as
test vectors; the fill computes them from the transcribed inputs. Drains and the largest fitting
rate are printed from unrounded inputs, so they are compared within 1 s and 0.01 (Decision 17).
"""

from __future__ import annotations

import pytest
from support.paths import REPO

from prereg.fill import FillResult, fill_registration
from prereg.registration import dump_registration, load_registration

ROOT = REPO
CELLS = ["sglang-a100-300k", "vllm-a100-300k", "sglang-a100-native", "sglang-h200-300k", "sglang-h200-600k"]


@pytest.fixture(scope="module")
def filled() -> dict[str, FillResult]:
    return {
        c: fill_registration(ROOT / f"prereg/inputs/paper/{c}", ROOT / f"prereg/templates/e2-{c}.yaml", repo_root=ROOT)
        for c in CELLS
    }


def _drains(r: FillResult) -> list[float]:
    return [d["drain_s"] for d in r.registration.fill["drain"]["per_rate"]]


def _warning(r: FillResult, wid: str) -> float | None:
    return next(w.value for w in r.registration.warnings if w.id == wid)


def test_e2_sglang_300k(filled: dict[str, FillResult]) -> None:
    r = filled["sglang-a100-300k"]
    reg, f = r.registration, r.registration.fill
    assert reg.status == "FILLED" and reg.decisive
    assert (f["window"]["low"], f["window"]["high"], f["window"]["binding"]) == (1.0, 2.0, "e0b_edge")
    assert f["window"]["mu_star_over_lambda_ref"] == pytest.approx(3.26, abs=0.005)
    assert f["window"]["low_sessions_per_s"] == pytest.approx(0.0715, abs=5e-5)
    assert f["window"]["high_sessions_per_s"] == pytest.approx(0.1431, abs=5e-5)
    assert reg.multiples() == [1.35, 1.65]
    assert [x.sessions_per_s for x in reg.rates] == pytest.approx([0.0966, 0.1180], abs=5e-5)
    assert (f["band"]["low"], f["band"]["high"]) == (1.1, 1.8)
    assert (reg.cap, f["cap"]["argmax"], f["cap"]["ambiguous"]) == (20, 24, True)
    assert _drains(r) == pytest.approx([1571, 1889], abs=1.0)
    assert f["drain"]["budget_s"] == 5760.0
    assert f["drain"]["largest_fitting_multiple"] == pytest.approx(2.64, abs=0.01)
    assert _warning(r, "mu_nmax_vs_lambda_miss") == pytest.approx(0.507, abs=5e-4)
    assert any(w.id == "cap_ambiguous" for w in reg.warnings)
    assert reg.references.lambda_ref == 0.07153 and reg.references.lambda_miss == 0.07153
    assert reg.references.lambda_miss_sessions == 0.07167 and reg.references.all_miss_token_rate == 11243.0
    e0b = f["measured"]["e0b"]
    assert (e0b["edge"], e0b["first_unstable"], e0b["monotone"]) == (2.0, 2.5, True)
    assert reg.seeds == [0, 1, 2] and len(reg.plans) == 18
    # BURST and CAPPED of a seed and rate play one plan; NOBURST's differs
    by = {(p.arm, p.rate, p.seed): p.sha256 for p in reg.plans}
    assert by[("burst", 1.35, 0)] == by[("capped", 1.35, 0)] != by[("noburst", 1.35, 0)]
    kill = {k.id: k for k in reg.kill_conditions}
    assert set(kill) == {"K1", "K2", "K3", "K4"} and kill["K3"].params["rates"] == [1.35, 1.65]
    assert kill["K4"].frozen["triggered"] is False and kill["K4"].frozen["noise"] == pytest.approx(2 * 0.0038 / 0.07153)


def test_vllm_300k(filled: dict[str, FillResult]) -> None:
    r = filled["vllm-a100-300k"]
    reg, f = r.registration, r.registration.fill
    assert reg.status == "FILLED"
    assert (f["window"]["high"], f["window"]["binding"]) == (2.0, "e0b_edge")
    assert f["window"]["mu_star_over_lambda_ref"] == pytest.approx(3.34, abs=0.005)
    assert f["window"]["high_sessions_per_s"] == pytest.approx(0.1313, abs=5e-5)
    assert reg.multiples() == [1.35, 1.65]
    assert [x.sessions_per_s for x in reg.rates] == pytest.approx([0.0886, 0.1083], abs=5e-5)
    assert (reg.cap, f["cap"]["argmax"], f["cap"]["ambiguous"], f["cap"]["at_threshold"]) == (20, 20, True, [20, 24])
    assert _drains(r) == pytest.approx([1529, 1800], abs=1.0)
    assert f["drain"]["largest_fitting_multiple"] == pytest.approx(2.81, abs=0.01)
    assert _warning(r, "mu_nmax_vs_lambda_miss") == pytest.approx(0.599, abs=5e-4)
    assert reg.references.all_miss_token_rate == 10349.0


def test_native_pool(filled: dict[str, FillResult]) -> None:
    r = filled["sglang-a100-native"]
    reg, f = r.registration, r.registration.fill
    assert reg.status == "FILLED"
    assert (f["window"]["high"], f["window"]["binding"]) == (5.5, "e0b_edge")
    assert f["window"]["mu_star_over_lambda_ref"] == pytest.approx(6.67, abs=0.005)
    assert reg.multiples() == [2.5, 4.0]
    assert [x.sessions_per_s for x in reg.rates] == pytest.approx([0.1795, 0.2872], abs=5e-5)
    assert (f["band"]["low"], f["band"]["high"]) == (1.1, 4.95)
    assert (reg.cap, f["cap"]["ambiguous"], f["cap"]["at_threshold"]) == (64, True, [64, 80])
    assert _drains(r) == pytest.approx([668, 1043], abs=1.0)  # our arithmetic (the paper prints none)
    assert f["drain"]["largest_fitting_multiple"] == pytest.approx(6.19, abs=0.01)
    assert _warning(r, "mu_nmax_vs_lambda_miss") == pytest.approx(0.407, abs=5e-4)


def test_h200_300k_is_incomplete(filled: dict[str, FillResult]) -> None:
    r = filled["sglang-h200-300k"]
    reg, f = r.registration, r.registration.fill
    assert reg.status == "INCOMPLETE" and f["formula_status"] == "INCOMPLETE" and not reg.plans
    assert (f["window"]["low"], f["window"]["high"]) == (1.0, 1.3)
    assert [x["rounded"] for x in f["rates"]] == [1.1, 1.2]
    assert (f["band"]["low"], f["band"]["high"]) == (1.1, 1.17)
    assert [x["inside_band"] for x in f["rates"]] == [False, False]
    assert any("rate 1.1 " in s and "(1.1, 1.17)" in s for s in reg.status_reasons)
    assert any("rate 1.2 " in s for s in reg.status_reasons)


def test_h200_600k_rates_and_cap(filled: dict[str, FillResult]) -> None:
    """The formula places the paper's H200 600k test (FILLED by the formula). The paper does not
    print the H200 all-miss token rate, so our transcription cannot bind a test: the file is
    INCOMPLETE for that reason alone, and says so."""
    r = filled["sglang-h200-600k"]
    reg, f = r.registration, r.registration.fill
    assert f["formula_status"] == "FILLED"
    assert (f["window"]["high"], f["window"]["binding"]) == (2.5, "e0b_edge")
    assert reg.multiples() == [1.5, 2.0] and (f["band"]["low"], f["band"]["high"]) == (1.1, 2.25)
    assert reg.cap == 48 and all(x["inside_band"] for x in f["rates"])
    assert reg.status == "INCOMPLETE" and reg.status_reasons == [
        "E0a gives no all-miss token rate: the TRAPPED rule cannot be judged without it"
    ]


@pytest.mark.parametrize("cell", CELLS)
def test_committed_registration_is_the_fill(filled: dict[str, FillResult], cell: str) -> None:
    """prereg/registrations/ holds exactly what the formula gives: a refill is byte-identical."""
    path = ROOT / f"prereg/registrations/e2-{cell}.yaml"
    assert dump_registration(filled[cell].registration) == path.read_bytes()
    reg = load_registration(path)
    for inp in reg.inputs:
        assert (ROOT / inp.path).is_file() and inp.path.startswith(f"prereg/inputs/paper/{cell}/")


def test_every_committed_registration_is_its_fill() -> None:
    """scripts/refill_registrations.py --check: each file under prereg/registrations/ (paper,
    simulator, CPU and derived ones) equals the fill of the template and inputs it records."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("refill", ROOT / "scripts/refill_registrations.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    assert mod.main(["--check"]) == 0


def test_cell_launch_fields_written_only_when_set() -> None:
    """An SGLang CPU launch field left unset is not in the file (older registrations keep their
    bytes); set, it is written and reads back."""
    import yaml

    reg = load_registration(ROOT / "prereg/registrations/e2-sglang-a100-300k.yaml")
    assert "device" not in yaml.safe_load(dump_registration(reg))["cell"]
    cpu = reg.model_copy(update={"cell": reg.cell.model_copy(update={"device": "cpu", "mem_fraction_static": 0.5})})
    cell = yaml.safe_load(dump_registration(cpu))["cell"]
    assert cell["device"] == "cpu" and cell["mem_fraction_static"] == 0.5
