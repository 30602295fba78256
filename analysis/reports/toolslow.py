"""TOOLSLOW (r14) and TOOLSLOW-W / D15 (r15): per slowdown, the seeds' endpoints, hit fraction,
slope against the threshold and slowed calls; for r15 the trap-state scores S1-S5."""

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
from analysis.reports.scores import scores_table

COLUMNS = [
    ("hit", "hit", "{:.3f}"),
    ("slope", "slope", "{:+.4f}"),
    ("threshold", "slope_threshold", "{:.4f}"),
    ("outstanding end", "outstanding_end", "{:.0f}"),
    ("slowed sessions", "trigger.n", "{:.0f}"),
    ("last slowed left", "trigger.last_left", "{:.0f}"),
    ("hits after", "trigger.hits_after", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    rows = []
    for rate in verdict["registered_rates"]:
        for arm in verdict["arms"]:
            rs = runs_of(verdict, arm, rate)
            st = [rs[s] for s in verdict["seeds"] if s in rs]
            if not st:
                continue
            ts = q(st[0], "arm.toolslow.delta")
            window = (
                f"[{num(q(st[0], 'arm.toolslow.start'), '{:.0f}')}, {num(q(st[0], 'arm.toolslow.end'), '{:.0f}')})"
                if ts
                else "-"
            )
            rows.append(
                [
                    num(rate, "{:g}"),
                    arm,
                    num(ts, "{:.0f}"),
                    window,
                    letters(verdict, arm, rate, "endpoint"),
                    rng([q(r, "hit") for r in st]),
                    rng([q(r, "slope") for r in st], "{:+.4f}"),
                    rng([q(r, "slope_threshold") for r in st], "{:.4f}"),
                ]
            )
    lines = [
        *header(verdict, "TOOLSLOW"),
        "Endpoints per seed: S stuck, G good (RECOVERED, or hit > 0.8 with slope at most 0.5 (λ − λref)), N neither.",
        "",
        *table(
            ["λ/λref", "arm", "δ (s)", "slowed calls starting in", "endpoints", "hit", "slope (s⁻¹)", "threshold"], rows
        ),
        "",
        outcome_block(verdict),
    ]
    if any("S1_pooled" in g["checks"] for g in verdict["groups"]):
        lines += ["", "#### Trap-state scores (stuck runs)", "", *scores_table(verdict)]
    lines += ["", "#### Per run", "", *per_run_table(verdict, COLUMNS, ["endpoint", "state", "persistence"])]
    return "\n".join(lines)


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    def marks(axes: Any, rate: Any) -> None:
        for a in analyzed:
            if a.meta and (a.meta.get("arm_config") or {}).get("toolslow"):
                ts = a.meta["arm_config"]["toolslow"]
                for ax in axes:
                    ax.axvspan(ts["start"], ts["end"], color="0.92", zorder=0)
                return

    return hit_backlog_figure(verdict, analyzed, path, title="shaded: tool calls starting here are slowed", marks=marks)
