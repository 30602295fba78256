"""The fallback report: outcome block, per-run table, Fig. 1 layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.reports.common import header, hit_backlog_figure, outcome_block, per_run_table

COLUMNS = [
    ("hit", "hit", "{:.3f}"),
    ("follow-up hit", "followup_hit", "{:.3f}"),
    ("tokens × all-miss", "token_ratio", "{:.3f}"),
    ("backlog", "backlog_mean", "{:.1f}"),
    ("slope", "slope", "{:+.4f}"),
    ("outstanding end", "outstanding_end", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    lsets = list((verdict["runs"][0]["labels"] if verdict["runs"] else {}).keys())[:3]
    return "\n".join(
        [
            *header(verdict, "test"),
            outcome_block(verdict),
            "",
            "#### Per run",
            "",
            *per_run_table(verdict, COLUMNS, lsets),
        ]
    )


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    return hit_backlog_figure(verdict, analyzed, path, title="one line per run")
