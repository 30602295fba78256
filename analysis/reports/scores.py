"""Trap-state scores S1-S5 (sec. 4, App. C): per run and pooled, with the refutation rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.reports.common import header, hit_backlog_figure, num, outcome_block, table


def scores_table(verdict: Mapping[str, Any]) -> list[str]:
    rows = []
    for g in verdict["groups"]:
        for s, sd in g["seeds"].items():
            d = sd["derived"]
            if not d.get("eligible"):
                continue
            rows.append(
                [
                    g["group"],
                    s,
                    num(d.get("s1_dev"), "{:+.1%}"),
                    num(d.get("s2_ratio"), "{:.3f}"),
                    num(d.get("s3_load"), "{:.2f}"),
                    num(d.get("s3_run")),
                    num(d.get("s4_ratio"), "{:.2f}"),
                    num(d.get("s5_plugin"), "{:+.4f}"),
                    num(d.get("s5_side")),
                    num(d.get("s5_close")),
                ]
            )
        a, dv, ch = g["aggregates"], g["derived"], g["checks"]
        if "n_eligible" in a:
            rows.append(
                [
                    g["group"],
                    f"pooled ({num(a['n_eligible'], '{:.0f}')})",
                    num(dv.get("s1_pooled"), "{:+.1%}"),
                    num(dv.get("s2_pooled"), "{:.3f}"),
                    "",
                    "",
                    num(dv.get("s4_pooled_alpha"), "{:+.0%}"),
                    "",
                    f"S5 side {num(a.get('s5_side_n'), '{:.0f}')}",
                    f"close {num(a.get('s5_close_n'), '{:.0f}')}",
                ]
            )
            rows.append(
                [
                    g["group"],
                    "checks",
                    *(
                        ("✓" if ch[k]["holds"] else "✗") + f" {k}"
                        for k in (
                            "S1_per_run",
                            "S1_pooled",
                            "S2_pooled",
                            "S3_per_run",
                            "S3_pooled",
                            "S4_pooled",
                            "S5_side_all",
                            "refuted",
                        )
                        if k in ch
                    ),
                ]
            )
    head = [
        "λ/λref",
        "seed",
        "S1 composition",
        "S2 gap slope / γ",
        "load × λref",
        "S3 > λref",
        "S4 slope / α",
        "S5 plug-in",
        "S5 side",
        "S5 close",
    ]
    width = len(head)
    return table(head, [(r + [""] * width)[:width] for r in rows])


def markdown(verdict: Mapping[str, Any]) -> str:
    return "\n".join([*header(verdict, "trap-state scores"), *scores_table(verdict), "", outcome_block(verdict)])


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    return hit_backlog_figure(verdict, analyzed, path, title="runs scored by S1-S5")
