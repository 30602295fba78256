"""The registration loader: strict, hashing the bytes it parsed, with errors naming file and field."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from analysis.rules import load_rule
from harness.config import CellConfig, ProtocolConfig, WorkloadConfig, config_ref, load_config
from prereg.registration import FORMAT, RegistrationError, load_registration, registration_from_data, write_registration


def _minimal(status: str = "INCOMPLETE") -> dict[str, Any]:
    cell = load_config(config_ref("sglang-a100-300k", "cells"), CellConfig).model_dump(mode="json")
    cell["cost_file"] = None
    return {
        "format": FORMAT,
        "format_version": 1,
        "name": "x",
        "status": status,
        "status_reasons": ["window too narrow"],
        "test": "t",
        "cell": cell,
        "workload": load_config(config_ref("standard", "workloads"), WorkloadConfig).model_dump(mode="json"),
        "protocol": load_config(config_ref("e2", "protocols"), ProtocolConfig).model_dump(mode="json"),
        "arms": ["burst"],
        "rates": [{"multiple": 1.35, "sessions_per_s": 1.35 * 0.07153}],
        "seeds": [0],
        "cap": 20,
        "references": {"lambda_ref": 0.07153, "lambda_miss": 0.07153, "all_miss_token_rate": 11243.0},
        "rule": load_rule(),
    }


def test_round_trip_and_hash(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    h = write_registration(_minimal(), p)
    reg = load_registration(p)
    assert reg.sha256 == h == hashlib.sha256(p.read_bytes()).hexdigest()
    assert reg.path == p and reg.cell.kv_pool_tokens == 300000 and not reg.decisive
    assert write_registration(_minimal(), tmp_path / "again.yaml") == h  # byte identity


def test_expected_hash_refused(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    write_registration(_minimal(), p)
    with pytest.raises(RegistrationError, match=r"SHA-256 is .*; expected 0{64}"):
        load_registration(p, expect_sha256="0" * 64)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda d: d.update(bogus=1), "bogus: unknown key"),
        (lambda d: d["references"].update(lambda_ref=-1.0), "references.lambda_ref: got -1.0"),
        (lambda d: d.pop("test"), "test: required field is missing"),
        (lambda d: d.update(status="DONE"), "status: got 'DONE'"),
        (lambda d: d.update(format="something"), "format: got 'something'"),
        (lambda d: d.update(status="FILLED"), "plans: no plan hash"),
        (lambda d: d.update(status="EXPLORATORY"), "parent: an EXPLORATORY registration"),
        (lambda d: d.update(status_reasons=[]), "status_reasons"),
        (
            lambda d: d["rates"][0].update(sessions_per_s=0.2),
            "rates[0].sessions_per_s: got 0.2; expected multiple x lambda_ref",
        ),
        (lambda d: d["rule"].pop("states"), "rule: expected a valid rule spec"),
        (lambda d: d["cell"].update(kv_pool_tokens="many"), "cell.kv_pool_tokens: got 'many'"),
    ],
)
def test_errors_name_field_and_value(edit: Any, field: str) -> None:
    d = _minimal()
    edit(d)
    with pytest.raises(RegistrationError) as exc:
        registration_from_data(d, "prereg/registrations/x.yaml")
    assert "prereg/registrations/x.yaml" in str(exc.value)
    assert field in str(exc.value), str(exc.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(RegistrationError, match="cannot read"):
        load_registration(tmp_path / "absent.yaml")


def test_bound_input_is_the_file_the_registration_binds() -> None:
    root = Path(__file__).resolve().parents[3]
    reg = load_registration(root / "prereg" / "registrations" / "e2-vllm-cpu-tiny-65k-fp32.yaml")
    found = reg.bound_input("e0a")
    assert found is not None
    path, shown = found
    assert shown == "prereg/inputs/vllm-cpu-tiny-65k-fp32/e0a.yaml" and path == root / shown
    bound = next(i for i in reg.inputs if i.role == "e0a")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == bound.sha256  # the very bytes it binds
    assert reg.bound_input("no-such-stage") is None
