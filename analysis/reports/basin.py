"""BASIN-1 / BASIN-2 (App. E.6): per burst size, the seeds' endpoints and states, hit fraction,
tokens, backlog and slope, in the layout of the paper's basin paragraphs (Table 7 columns)."""

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
    ("tokens × all-miss", "token_ratio", "{:.3f}"),
    ("backlog", "backlog_mean", "{:.1f}"),
    ("slope", "slope", "{:+.4f}"),
    ("burst done by", "trigger.last_left", "{:.0f}"),
    ("onset", "persist.onset", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    rows = []
    for rate in verdict["registered_rates"]:
        for arm in verdict["arms"]:
            rs = runs_of(verdict, arm, rate)
            st = [rs[s] for s in verdict["seeds"] if s in rs]
            rows.append(
                [
                    num(rate, "{:g}"),
                    arm,
                    num(q(st[0], "arm.burst_size") if st else None, "{:.0f}"),
                    letters(verdict, arm, rate, "endpoint"),
                    letters(verdict, arm, rate, "state"),
                    rng([q(r, "hit") for r in st]),
                    rng([q(r, "token_ratio") for r in st]),
                    rng([q(r, "backlog_mean") for r in st], "{:.1f}"),
                    rng([q(r, "slope") for r in st], "{:+.4f}"),
                ]
            )
    lines = [
        *header(verdict, "BASIN"),
        "Endpoints per seed: S stuck (follow-up hit < 0.2 over the window), G good (RECOVERED), N neither; "
        "states T trapped, R recovered, D draining, I indeterminate. Ranges over seeds.",
        "",
        *table(
            [
                "λ/λref",
                "arm",
                "burst size",
                "endpoints",
                "states",
                "hit",
                "tokens × all-miss",
                "backlog",
                "slope (s⁻¹)",
            ],
            rows,
        ),
        "",
        outcome_block(verdict),
        "",
        "#### Per run",
        "",
        *per_run_table(verdict, COLUMNS, ["endpoint", "state"]),
    ]
    return "\n".join(lines)


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    return hit_backlog_figure(verdict, analyzed, path, title="one line per run; colour: burst size")
