"""A judged run with what its report draws, in a module that imports neither pandas nor the
measures.

Why a module of its own: `analyze` draws its figure in a process that never scored anything
(analysis/figure_process.py). That process unpickles these runs, and a class defined beside
the scoring (analysis/staged_analysis.py) would make it import pandas first, about 0.3 s, to learn a
class with four fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.stages import StagedRun

if TYPE_CHECKING:
    import numpy as np


@dataclass
class StagedAnalyzedRun:
    """A judged run with what its report draws: the figure series, meta.json, and the open-loop
    summary of its session starts (analysis/openloop.py; None for a record without them)."""

    run: StagedRun
    series: dict[str, np.ndarray] | None
    meta: dict[str, Any] | None
    open_loop: dict[str, Any] | None = None
