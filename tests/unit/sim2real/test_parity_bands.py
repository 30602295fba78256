"""sim2real/parity.py's hit band: the fixed tolerance, widened to the binomial noise of short bins."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real.parity import Bands, _hit_tolerance


def test_the_band_is_the_fixed_tolerance_where_bins_hold_many_turns() -> None:
    h = np.array([0.85, 0.0, 0.5])
    n = np.array([4000.0, 4000.0, 4000.0])
    assert _hit_tolerance(Bands(), h, h, n, n) == pytest.approx([0.10, 0.10, 0.10])


def test_a_short_bin_widens_the_band_by_its_binomial_noise_and_z_zero_is_the_fixed_band() -> None:
    # 11 turns a bin at hit 0.85 (a 0.5 s bin of a scaled protocol at ~2 sessions/s)
    hr, hs, n = np.array([0.85]), np.array([0.7]), np.array([11.0])
    pooled = 0.775
    se = np.sqrt(pooled * (1 - pooled) * (2 / 11))
    assert _hit_tolerance(Bands(), hr, hs, n, n)[0] == pytest.approx(2 * se)  # ~0.356
    assert _hit_tolerance(Bands(hit_noise_z=0.0), hr, hs, n, n)[0] == pytest.approx(0.10)
    # a bin with no hits against one with every hit has no pooled noise to hide in beyond 2 se
    far = _hit_tolerance(Bands(), np.array([0.0]), np.array([1.0]), n, n)[0]
    assert far < 1.0


def test_an_empty_bin_gets_the_fixed_tolerance() -> None:
    tol = _hit_tolerance(Bands(), np.array([np.nan]), np.array([np.nan]), np.array([0.0]), np.array([0.0]))
    assert tol[0] == pytest.approx(0.10)
