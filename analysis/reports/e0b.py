"""E0b (App. E.3): per grid rate the final queue and fitted rise, stability, and the edge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.reports.common import header, hit_backlog_figure, label, num, outcome_block, q, runs_of, table


def markdown(verdict: Mapping[str, Any]) -> str:
    rows = []
    for rate in verdict["registered_rates"]:
        for s, r in sorted(runs_of(verdict, verdict["arms"], rate).items()):
            rows.append(
                [
                    num(rate, "{:g}"),
                    str(s),
                    num(q(r, "e0b.final"), "{:.1f}"),
                    num(q(r, "e0b.rise"), "{:.1f}"),
                    num(q(r, "hit"), "{:.3f}"),
                    num(q(r, "sessions"), "{:.0f}"),
                    label(r, "stability"),
                ]
            )
    td = verdict.get("test_derived", {})
    return "\n".join(
        [
            *header(verdict, "E0b"),
            *table(["×λref", "seed", "final queue", "rise over 1500 s", "hit", "sessions", "run"], rows),
            "",
            f"Edge (largest multiple with every rate up to it stable): {num(td.get('edge'), '{:g}')}; monotone: "
            f"{td.get('monotone')}.",
            "",
            outcome_block(verdict),
        ]
    )


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    return hit_backlog_figure(verdict, analyzed, path, title="one column per grid rate")
