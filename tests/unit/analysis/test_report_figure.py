"""The reports' figures: a log axis labelled as matplotlib labels it, in plain text (no mathtext)."""

from __future__ import annotations

import pytest

from analysis.reports.common import log_y, plain_power


def test_plain_power_writes_the_log_formatters_labels_in_plain_text() -> None:
    assert plain_power(r"$\mathdefault{10^{2}}$") == "10²"
    assert plain_power(r"$\mathdefault{10^{-1}}$") == "10⁻¹"
    assert plain_power(r"$\mathdefault{2\times10^{1}}$") == "2×10¹"
    assert plain_power(r"$\mathdefault{-10^{3}}$") == "-10³"
    assert plain_power("") == ""
    assert plain_power(r"$\mathdefault{0}$") == r"$\mathdefault{0}$"  # any other label as given


@pytest.mark.parametrize(("lo", "hi"), [(0.6, 250.0), (2.0, 9.0), (0.05, 3e4), (0.8, 1.6)])
def test_log_y_labels_the_ticks_matplotlib_labels(lo: float, hi: float) -> None:
    from matplotlib.figure import Figure

    ref, ours = Figure().subplots(), Figure().subplots()
    ref.set_yscale("log")
    log_y(ours)
    for ax in (ref, ours):
        ax.set_ylim(lo, hi)
    for minor in (False, True):
        want = [plain_power(t.get_text()) for t in ref.yaxis.get_ticklabels(minor=minor)]
        got = [t.get_text() for t in ours.yaxis.get_ticklabels(minor=minor)]
        assert got == want and not any("$" in s for s in got)
    assert list(ours.get_yticks()) == list(ref.get_yticks())
