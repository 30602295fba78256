"""Registrations derived from a FILLED one: EXPLORATORY grid cells, and FILLED tests of other
families on a registered calibration (based_on)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO

from harness.errors import ConfigError
from prereg.fill import fill_registration
from prereg.registration import RegistrationError, dump_registration, load_registration
from prereg.template import load_template

ROOT = REPO
E2 = ROOT / "prereg" / "registrations" / "e2-sglang-a100-300k.yaml"


@pytest.mark.parametrize("cell", ["fcfs-r0", "lpm-r1", "lpm-r0"])
def test_grid_cells_are_exploratory_children_of_e2(cell: str) -> None:
    res = fill_registration(None, ROOT / f"prereg/templates/grid-sglang-{cell}.yaml", repo_root=ROOT)
    reg, parent = res.registration, load_registration(E2)
    assert reg.status == "EXPLORATORY" and not reg.decisive
    assert (
        reg.parent is not None
        and reg.parent.sha256 == parent.sha256
        and reg.parent.path == "prereg/registrations/e2-sglang-a100-300k.yaml"
    )
    assert reg.multiples() == parent.multiples() and reg.references == parent.references and reg.arms == ["burst"]
    assert reg.cell.name == f"sglang-a100-300k-{cell}"
    assert reg.cell.schedule_policy == cell.split("-")[0] and reg.cell.waiting_prefix_refresh == cell.endswith("r1")
    assert {p.sha256 for p in reg.plans} <= {p.sha256 for p in parent.plans}  # the parent's BURST plans, byte for byte
    assert dump_registration(reg) == (ROOT / f"prereg/registrations/grid-sglang-{cell}.yaml").read_bytes()


def _based_on(tmp: Path, body: str) -> Path:
    t = tmp / "t.yaml"
    t.write_text(f"""format: agentload-registration-template
format_version: 1
name: replicate
test: replicate
based_on: {E2}
rule: e2
{body}""")
    return t


def test_based_on_reuses_the_calibration(tmp_path: Path) -> None:
    t = _based_on(tmp_path, "arms: [burst, noburst, capped]\nrates: [1.65]\nseeds: [3, 4, 5]\n")
    reg = fill_registration(None, t, repo_root=ROOT).registration
    parent = load_registration(E2)
    assert reg.status == "FILLED" and reg.parent is None and reg.fill["based_on"]["sha256"] == parent.sha256
    assert (
        reg.multiples() == [1.65] and reg.cap == 20 and reg.references == parent.references and reg.cell == parent.cell
    )
    assert reg.inputs[0].role == "parent" and {i.path for i in reg.inputs[1:]} == {i.path for i in parent.inputs}
    assert len(reg.plans) == 9


def test_based_on_refuses_unregistered_rates(tmp_path: Path) -> None:
    t = _based_on(tmp_path, "arms: [burst]\nrates: [1.5]\nseeds: [0, 1, 2]\n")
    with pytest.raises(
        RegistrationError, match=r"rates: got \[1\.5\]; expected rates registered by .*\[1\.35, 1\.65\]"
    ):
        fill_registration(None, t, repo_root=ROOT)


def test_derivation_needs_a_filled_parent(tmp_path: Path) -> None:
    t = tmp_path / "t.yaml"
    t.write_text(f"""format: agentload-registration-template
format_version: 1
name: x
test: x
parent: {ROOT / "prereg/registrations/e2-sglang-h200-300k.yaml"}
arms: [burst]
""")
    with pytest.raises(RegistrationError, match="has status INCOMPLETE; expected a FILLED registration"):
        fill_registration(None, t, repo_root=ROOT)


FAMILIES = sorted(p.name for p in (ROOT / "prereg" / "templates").glob("*.yaml") if "based_on:" in p.read_text())


@pytest.mark.parametrize("name", FAMILIES)
def test_family_templates(name: str) -> None:
    """Each family template names its rule and arms; it fills once they are defined (the rule
    specs and arm configs of every test family come with the rules' own module)."""
    t = load_template(ROOT / "prereg" / "templates" / name)
    assert t.based_on and t.rates and t.arms and t.seeds
    try:
        reg = fill_registration(None, ROOT / "prereg" / "templates" / name, repo_root=ROOT).registration
    except (RegistrationError, ConfigError) as exc:
        if "rule:" in str(exc) or "not found" in str(exc):
            pytest.skip(f"{name}: its rule or arms are not defined in this checkout ({str(exc)[:120]})")
        raise
    assert (
        reg.status == "FILLED"
        and reg.multiples() == t.rates
        and len(reg.plans) == len(t.arms) * len(t.rates) * len(t.seeds)
    )
