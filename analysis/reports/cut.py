"""CUT-A / CUT-B (sec. 5, App. C, Table 12): per seed the measured slope against model F's frozen
slope and the comparators; the figure is the backlog with model F's trajectory (dashed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analysis.predictions import Predictions
from analysis.reports.common import header, num, outcome_block, per_run_table, q, runs_of, table

COLUMNS = [
    ("hit", "hit", "{:.3f}"),
    ("S [3000, 8700)", "s_slope", "{:+.4f}"),
    ("late slope", "late_slope", "{:+.4f}"),
    ("λ'_plan (s⁻¹)", "lam_plan", "{:.4f}"),
    ("completions [3000, 8700)", "d_own", "{:.4f}"),
    ("present at end", "end_backlog", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    cut_arm = verdict["rule_spec"]["roles"]["cut"]["arm"]
    rows = []
    for g in verdict["groups"]:
        rr = runs_of(verdict, cut_arm, g["rate"])
        for s in verdict["seeds"]:
            d = g["seeds"][str(s)]["derived"]
            r = rr.get(s)
            lam_ref = q(r, "lambda_ref") or float("nan")
            rows.append(
                [
                    g["group"],
                    str(s),
                    num(d.get("S"), "{:+.4f}"),
                    num(d.get("F"), "{:+.4f}"),
                    num(d.get("naive"), "{:+.4f}"),
                    num(d.get("quasi_static"), "{:+.4f}")
                    if verdict["rule_spec"]["params"].get("use_quasi_static") == 1
                    else "-",
                    num(d.get("d_trap"), "{:.4f}"),
                    num((q(r, "lam_plan") or float("nan")) / lam_ref, "{:.3f}"),
                    num(d.get("theory_favoured")),
                    num(q(r, "late_slope"), "{:+.4f}"),
                    num(q(r, "pred.slope_late"), "{:+.4f}"),
                    r["labels"].get("endpoint", "-") if r else "MISSING",
                    num(q(r, "end_backlog"), "{:.0f}"),
                    num(q(r, "pred.end_backlog"), "{:.0f}"),
                ]
            )
    head = [
        "λ/λref",
        "seed",
        "S",
        "model F",
        "naive",
        "quasi-static",
        "D_trap",
        "λ'_plan / λref",
        "theory-favoured",
        "slope [5700, 8700)",
        "model F late",
        "endpoint",
        "present at 8700",
        "model F",
    ]
    return "\n".join(
        [
            *header(verdict, "CUT"),
            "Slopes in sessions/s over [3000, 8700) unless marked.",
            "",
            *table(head, rows),
            "",
            outcome_block(verdict),
            "",
            "#### Per run",
            "",
            *per_run_table(verdict, COLUMNS, ["endpoint", "state"]),
        ]
    )


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cut_arm = verdict["rule_spec"]["roles"]["cut"]["arm"].lower()
    pinfo = verdict.get("predictions") or {}
    preds = None
    if pinfo.get("path"):
        try:
            preds = Predictions.load(pinfo["path"])
        except Exception:  # a moved prediction file leaves the figure without its dashed lines
            preds = None
    fig, ax = plt.subplots(1, 1, figsize=(8, 4.6))
    cols = ["#c0392b", "#2471a3", "#239b56", "#8e44ad"]
    for a in analyzed:
        if a.series is None:
            continue
        c = cols[a.run.seed % len(cols)]
        s = a.series
        is_cut = a.run.arm.lower() == cut_arm
        ax.plot(
            s["backlog_t"],
            s["in_system"],
            color=c,
            lw=1.0 if is_cut else 0.6,
            alpha=0.9 if is_cut else 0.35,
            label=f"seed {a.run.seed}" if is_cut else None,
        )
        tr = preds.trajectory(a.run.arm, a.run.rate, a.run.seed) if preds and is_cut else None
        if tr:
            ax.plot(np.asarray(tr["t"]), np.asarray(tr["backlog"]), color=c, ls="--", lw=1.0)
    # the cut's start (the arm's) and the slope window [slope_start, end of run) (the rule's)
    meta = next((a.meta for a in analyzed if a.meta and a.run.arm.lower() == cut_arm), None)
    if meta is not None:
        ax.axvline(float(meta["arm_config"]["cut"]["start"]), color="0.3", ls=":", lw=0.8)
        slope_start = float(verdict["rule_spec"]["params"]["slope_start"])
        ax.axvspan(slope_start, float(meta["protocol"]["duration"]), color="0.95", zorder=0)
    ax.set_xlabel("time since start of run (s)")
    ax.set_ylabel("sessions in system")
    ax.legend(frameon=False)
    ax.set_title("CUT: backlog (solid: cut runs, faint: uncut controls; dashed: model F frozen)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
