"""`predict make` given a registration file: predictions about the registered test (its rates,
seeds, references and plans), bound to that registration without `--registration`."""

from __future__ import annotations

import pytest
from support.paths import REPO

from harness.errors import ConfigError
from prereg.predict_makers import is_registration_file, load_bundle
from prereg.predict_theory import model_f_predictions
from prereg.registration import load_registration

ROOT = REPO
REG = ROOT / "prereg" / "registrations" / "e2-sglang-a100-300k.yaml"


def test_a_registration_is_read_as_its_registered_test() -> None:
    reg = load_registration(REG)
    b = load_bundle(REG)
    assert is_registration_file(REG) and not is_registration_file(ROOT / "configs" / "tests" / "e2-sglang-300k.yaml")
    assert (
        b.test.rates == reg.multiples()
        and b.test.seeds == list(reg.seeds)
        and b.cell.lambda_ref == reg.references.lambda_ref
    )
    assert list(b.arms) == list(reg.arms)


def test_model_f_about_a_registration_is_bound_to_it_and_uses_its_plans() -> None:
    reg = load_registration(REG)
    pf = model_f_predictions(REG, rates=[reg.multiples()[0]])
    assert pf.registration is not None and pf.registration["sha256"] == reg.sha256
    shas = {p.source.get("plan_sha256") for p in pf.predictions} - {None}
    registered = {p.sha256 for p in reg.plans if p.arm == "burst" and p.rate == reg.multiples()[0]}
    assert shas and shas <= registered, (shas, registered)


def test_a_missing_file_is_not_a_registration() -> None:
    assert not is_registration_file(ROOT / "nope.yaml")
    with pytest.raises(ConfigError):
        load_bundle(ROOT / "nope.yaml")
