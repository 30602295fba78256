"""SHED (App. E.6): per stop length, the seeds' endpoints, hit, outstanding at the end and the
sessions refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.reports.common import (
    header,
    hit_backlog_figure,
    letters,
    num,
    outcome_block,
    per_run_table,
    q,
    rng,
    runs_of,
    table,
)

COLUMNS = [
    ("hit", "hit", "{:.3f}"),
    ("slope", "slope", "{:+.4f}"),
    ("outstanding end", "outstanding_end", "{:.0f}"),
    ("refused", "gate.refused", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    rows = []
    for rate in verdict["registered_rates"]:
        for arm in verdict["arms"]:
            rs = runs_of(verdict, arm, rate)
            st = [rs[s] for s in verdict["seeds"] if s in rs]
            if not st:
                continue
            rows.append(
                [
                    num(rate, "{:g}"),
                    arm,
                    num(q(st[0], "arm.shed.duration"), "{:.0f}"),
                    letters(verdict, arm, rate, "endpoint"),
                    letters(verdict, arm, rate, "state"),
                    rng([q(r, "hit") for r in st]),
                    ", ".join(num(q(rs.get(s), "outstanding_end"), "{:.0f}") for s in verdict["seeds"]),
                    ", ".join(num(q(rs.get(s), "gate.refused"), "{:.0f}") for s in verdict["seeds"]),
                ]
            )
    return "\n".join(
        [
            *header(verdict, "SHED"),
            "Endpoints per seed: S stuck, G good (r14), N neither.",
            "",
            *table(["λ/λref", "arm", "τ (s)", "endpoints", "states", "hit", "outstanding at end", "refused"], rows),
            "",
            outcome_block(verdict),
            "",
            "#### Per run",
            "",
            *per_run_table(verdict, COLUMNS, ["endpoint", "state"]),
        ]
    )


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    def marks(axes: Any, rate: Any) -> None:
        for a in analyzed:
            sh = (a.meta or {}).get("arm_config", {}).get("shed") if a.meta else None
            if sh:
                axes[1].axvspan(sh["start"], sh["start"] + sh["duration"], color="0.92", zorder=0)

    return hit_backlog_figure(verdict, analyzed, path, title="shaded: arrivals refused", marks=marks)
