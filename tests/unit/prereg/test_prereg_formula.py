"""Invariants of the registration formula, by property, and the fill's identity properties."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.prereg_fixture import write_case

from analysis.calibration_summaries import InputError
from prereg import formula as F
from prereg.fill import fill_registration, fill_to_file
from prereg.registration import RegistrationError

curves = st.dictionaries(st.integers(1, 400), st.floats(0.001, 1.0, allow_nan=False), min_size=1, max_size=10).map(
    lambda d: sorted(d.items())
)


@given(curves, st.floats(0.5, 1.0))
def test_cap_is_the_smallest_n_at_the_threshold_and_not_above_argmax(curve, fraction):
    c = F.cap_rule(curve, fraction=fraction)
    assert c.cap <= c.argmax
    mu = dict(curve)
    assert mu[c.cap] >= fraction * c.mu_star
    assert all(mu[n] < fraction * c.mu_star for n in mu if n < c.cap)
    assert c.mu_star == max(mu.values()) and mu[c.argmax] == c.mu_star
    assert c.ambiguous == (len([n for n in mu if mu[n] >= fraction * c.mu_star]) > 1)


@given(
    st.floats(0.01, 1.0),
    st.floats(0.01, 0.5),
    st.one_of(st.none(), st.sampled_from([1.1, 1.25, 1.3, 1.5, 2.0, 2.5, 3.0, 5.5])),
)
def test_window_upper_edge_is_the_smaller_term(mu_star, lam, edge):
    w = F.window(mu_star, lam, edge)
    if edge is None:
        assert w.high is None and w.empty
    else:
        assert float(w.high) == pytest.approx(min(mu_star / lam, edge))
        assert w.binding in ("e0b_edge", "mu_star", "both")


@settings(max_examples=300)
@given(st.decimals(Decimal("0.5"), Decimal("8"), places=3), st.decimals(Decimal("0.5"), Decimal("8"), places=3))
def test_rates_inside_the_band_or_incomplete(lo, hi):
    w = F.Window(lo, hi, "e0b_edge", float(hi), float(hi))
    p = F.place_rates(w)
    if w.empty:
        assert not p.ok and not p.rates
        return
    band = (Decimal("1.1") * lo, Decimal("0.9") * hi)
    for r in p.rates:
        assert (r.multiple / Decimal("0.05")) == (r.multiple / Decimal("0.05")).to_integral_value()  # on the 0.05 grid
        assert abs(r.multiple - r.raw) <= Decimal("0.025")
        assert r.inside == (band[0] < r.multiple < band[1])
    assert p.ok == (
        all(r.inside for r in p.rates) and len({r.multiple for r in p.rates}) == len(p.rates) and band[0] < band[1]
    )


def test_rounding_ties_half_up():
    assert F.round_to_step(Decimal("1.025"), Decimal("0.05")) == Decimal("1.05")
    assert F.round_to_step(Decimal("1.075"), Decimal("0.05"), "half_even") == Decimal("1.1")
    assert F.round_to_step(Decimal("1.025"), Decimal("0.05"), "half_even") == Decimal("1.0")


@given(st.lists(st.booleans(), min_size=1, max_size=8))
def test_prefix_edge(stable):
    grid = [1.0 + 0.25 * i for i in range(len(stable))]
    runs = {(m, 0): s for m, s in zip(grid, stable)}
    e = F.e0b_edge(grid, [0], runs)
    k = next((i for i, s in enumerate(stable) if not s), len(stable))
    assert e.edge == (grid[k - 1] if k > 0 else None)
    assert e.monotone == (k == len(stable) or not any(stable[k:]))
    if e.edge is not None:
        assert all(runs[(m, 0)] for m in grid if m <= e.edge)


def test_refined_drain_uses_the_rising_fixed_point():
    curve = [(16, 0.1756), (20, 0.2239), (24, 0.2333), (32, 0.115)]
    d = F.drain(0.2239, 20, 1.35, 0.07153, 200, 5760.0, curve)
    assert d.n1 == pytest.approx(0.0965655 / 0.1756 * 16)
    assert d.refined_s == pytest.approx((d.n1 + 200 - 20) / (0.2239 - 0.0965655))
    assert F.drain(0.09, 20, 1.35, 0.07153, 200, 5760.0, curve).fits is False  # mu(c) < lambda: never drains


# ---------------------------------------------------------------------------------------------
# the fill as a whole
# ---------------------------------------------------------------------------------------------
def test_repeated_fills_are_byte_identical(tmp_path: Path) -> None:
    inputs, tmpl = write_case(tmp_path)
    h1, _ = fill_to_file(inputs, tmpl, tmp_path / "a.yaml", repo_root=tmp_path)
    h2, _ = fill_to_file(inputs, tmpl, tmp_path / "b.yaml", repo_root=tmp_path)
    assert h1 == h2 and (tmp_path / "a.yaml").read_bytes() == (tmp_path / "b.yaml").read_bytes()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_edited_input_byte_changes_the_registration(tmp_path_factory, data) -> None:
    root = tmp_path_factory.mktemp("edit")
    inputs, tmpl = write_case(root)
    base = fill_registration(inputs, tmpl, repo_root=root).registration
    name = data.draw(st.sampled_from(["stage-c.yaml", "e0a.yaml", "e0b.yaml"]))
    p = inputs / name
    raw = bytearray(p.read_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    raw[i] = new
    p.write_bytes(bytes(raw))
    try:
        edited = fill_registration(inputs, tmpl, repo_root=root).registration
    except (InputError, RegistrationError, UnicodeDecodeError):
        return  # the edit made the input unreadable: refused, never silently filled
    assert edited.sha256 != base.sha256
    assert {i.sha256 for i in edited.inputs} != {i.sha256 for i in base.inputs}


def test_registered_parameters_change_the_outcome(tmp_path: Path) -> None:
    """A template reading the paper's AMB choices differently registers that reading."""
    inputs, tmpl = write_case(tmp_path, extra="fill: {cap_ambiguity: not_argmax_or_another, band_low_factor: 1.4}\n")
    reg = fill_registration(inputs, tmpl, repo_root=tmp_path).registration
    assert (
        reg.fill["params"]["band_low_factor"] == 1.4 and reg.fill["cap"]["ambiguity_reading"] == "not_argmax_or_another"
    )
    assert reg.status == "INCOMPLETE" and any("1.35" in s and "(1.4, 1.8)" in s for s in reg.status_reasons)


def _edit_e0b(inputs: Path, old: str, new: str) -> None:
    p = inputs / "e0b.yaml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))


def test_non_monotone_e0b_warns_and_keeps_the_prefix_edge(tmp_path: Path) -> None:
    inputs, tmpl = write_case(tmp_path)
    _edit_e0b(
        inputs,
        "- {multiple: 3.0, seed: 0, stable: false, final_backlog: 289.0, rise: 196.0, sessions: 697}",
        "- {multiple: 3.0, seed: 0, stable: true, sessions: 697}",
    )
    reg = fill_registration(inputs, tmpl, repo_root=tmp_path).registration
    e = reg.fill["measured"]["e0b"]
    assert (e["edge"], e["monotone"]) == (2.0, False) and reg.status == "FILLED"
    assert any(w.id == "e0b_not_monotone" for w in reg.warnings)


def test_no_stable_multiple_leaves_no_window(tmp_path: Path) -> None:
    inputs, tmpl = write_case(tmp_path)
    _edit_e0b(
        inputs,
        "- {multiple: 1.25, seed: 0, stable: true, sessions: 302}",
        "- {multiple: 1.25, seed: 0, stable: false, sessions: 302}",
    )
    reg = fill_registration(inputs, tmpl, repo_root=tmp_path).registration
    assert reg.status == "INCOMPLETE" and reg.fill["window"]["high"] is None and not reg.plans
    assert any("no E0b multiple was stable" in s for s in reg.status_reasons)
    assert next(k for k in reg.kill_conditions if k.id == "K4").frozen["triggered"] is True


def test_mu_star_binds_when_the_edge_is_higher(tmp_path: Path) -> None:
    """The min's other branch, never exercised by the paper's cells: mu*/lambda_ref below the edge."""
    inputs, tmpl = write_case(tmp_path)
    p = inputs / "stage-c.yaml"
    p.write_text(
        p.read_text()
        .replace("mu_sessions: 0.2333", "mu_sessions: 0.1300")
        .replace("mu_sessions: 0.2239", "mu_sessions: 0.1250")
        .replace("mu_sessions: 0.1756", "mu_sessions: 0.1100")
    )
    reg = fill_registration(inputs, tmpl, repo_root=tmp_path).registration
    w = reg.fill["window"]
    assert w["binding"] == "mu_star" and w["high"] == pytest.approx(0.13 / 0.07153)
    assert reg.multiples() == [1.25, 1.55] and reg.status == "FILLED"
