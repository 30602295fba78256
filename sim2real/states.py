"""Each run's state as the registered rule classes it, for the parity report.

Why: a replay is judged by whether it tells the same story as the run, and the story is the run's
state (TRAPPED, RECOVERED, ...), not how close two curves are. So every real run and its replay go
through the one judging path (analysis.staged_analysis.run_quantities with the rule's spec: the
same window statistics and state conditions as a verdict), and the report lists per run the state
and the quantities the states are decided on: the token rate over the E0a all-miss rate, the
window hit fraction, the backlog, and completions over lambda_ref.

Which rule is the caller's business (cli/sim2real.py): the run's registration's frozen rule when the
run is bound to one, else the rule the run names (its family's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.staged_analysis import run_quantities
from analysis.stages import COUNTED

#: the quantities listed beside each state (analysis/quantities.py names)
SHOWN = ("token_ratio", "hit", "backlog_end", "backlog_mean", "completions_ref", "window_len")


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def run_state(run_dir: Path | str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """One run classed by `spec`: its state (None when no state of the rule holds; the run's
    status, e.g. INVALID or FAILED, when it does not count), the run's status and reason, and
    the SHOWN quantities."""
    analyzed = run_quantities(run_dir, spec, series=False)
    r = analyzed.run
    q = r.quantities
    return {
        "state": r.labels.get("state"),
        "status": r.status,
        "reason": r.reason,
        **{k: _num(q.get(k)) for k in SHOWN},
    }


def compare_states(real_dir: Path | str, sim_dir: Path | str, spec: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The real run and its replay classed by one rule; `match`: the simulated state is the real one,
    both runs counted (two INVALID runs do not match: neither has a state)."""
    real, sim = run_state(real_dir, spec), run_state(sim_dir, spec)
    counted = real["status"] == sim["status"] == COUNTED
    return {
        "rule": spec.get("name"),
        "rule_source": source,
        "real": real,
        "sim": sim,
        "match": counted and real["state"] is not None and real["state"] == sim["state"],
    }
