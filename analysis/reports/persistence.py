"""Persistence and the trigger (App. D, D5 and D1): per run onset, escape, highest window after
onset, trapped time, and when the last trigger session left; the one-sided bound over runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.reports.common import header, hit_backlog_figure, num, outcome_block, per_run_table

COLUMNS = [
    ("onset (s)", "persist.onset", "{:.0f}"),
    ("escape (s)", "persist.escape", "{:.0f}"),
    ("highest after onset", "persist.max_after", "{:.3f}"),
    ("trapped (s)", "persist.trapped_s", "{:.0f}"),
    ("trigger sessions", "trigger.n", "{:.0f}"),
    ("still present", "trigger.still_present", "{:.0f}"),
    ("last left (s before end)", "trigger.before_end", "{:.0f}"),
    ("turns after", "trigger.turns_after", "{:.0f}"),
    ("hits after", "trigger.hits_after", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    ta, td = verdict.get("test_aggregates", {}), verdict.get("test_derived", {})
    summary = (
        f"Runs with an onset: {num(ta.get('n_onset'), '{:.0f}')}; escapes: {num(ta.get('n_escaped'), '{:.0f}')}; "
        f"trapped time {num(ta.get('trapped_h'), '{:.1f}')} h; highest window after onset "
        f"{num(ta.get('highest_after_onset'))}; one-sided 95% bound on a run's escape probability: "
        f"{num(td.get('escape_bound'), '{:.1%}')}."
    )
    return "\n".join(
        [
            *header(verdict, "persistence"),
            summary,
            "",
            outcome_block(verdict),
            "",
            "#### Per run",
            "",
            *per_run_table(verdict, COLUMNS, ["persistence", "endpoint"]),
        ]
    )


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    return hit_backlog_figure(verdict, analyzed, path, title="one line per run")
