"""MIRROR (sec. 4.1, App. C): the per-seed table of measured values against model F's frozen ones
(the paper's MIRROR table), the labels and the secondary checks; Fig. 4's layout (completions
per `completions_bin` (300 s) and the backlog, with model F's frozen trajectory dashed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analysis.predictions import Predictions
from analysis.reports.common import header, num, outcome_block, per_run_table, q, runs_of, table

COLUMNS = [
    ("follow-up hit", "followup_hit", "{:.3f}"),
    ("burst done", "wave.done", "{:.0f}"),
    ("served prompt", "prompt_w", "{:.0f}"),
    ("model F prompt", "pred.prompt", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    arm = verdict["rule_spec"]["roles"]["burst"]["arm"]
    rows = []
    for rate in verdict["registered_rates"]:
        rr = runs_of(verdict, arm, rate)
        for s in verdict["seeds"]:
            r = rr.get(s)
            rows.append(
                [
                    f"{rate:g}, {s}",
                    f"{num(q(r, 'c_blackout'))} ({num(q(r, 'pred.c_blackout'))})",
                    f"{num(q(r, 'wave.time'), '{:.0f}')} ({num(q(r, 'pred.wave'), '{:.0f}')})",
                    f"{num(q(r, 'c_late'))} ({num(q(r, 'pred.c_late'))})",
                    f"{num(q(r, 'slope_m4'), '{:.4f}')} ({num(q(r, 'pred.slope'), '{:.4f}')} / "
                    f"{num(q(r, 'pred.qs_slope'), '{:.4f}')})",
                    "".join(("✓" if q(r, m) else "✗") for m in ("m1", "m2", "m3", "m4")),
                    r["labels"].get("mirror", "-") if r else "MISSING",
                    num(q(r, "w5")),
                    num(q(r, "w7")),
                    num(q(r, "w8")),
                    num(q(r, "w10_below")),
                ]
            )
    head = [
        "rate, seed",
        "[2400, 3600) × λref",
        "wave (s)",
        "[6600, 8700) × λref",
        "slope [6000, 8700) (F / QS)",
        "M1–M4",
        "label",
        "W5",
        "W7",
        "W8",
        "W10 below",
    ]
    return "\n".join(
        [
            *header(verdict, "MIRROR"),
            "Measured, with model F's frozen value in parentheses.",
            "",
            *table(head, rows),
            "",
            outcome_block(verdict),
            "",
            "#### Per run",
            "",
            *per_run_table(verdict, COLUMNS, ["endpoint", "mirror"]),
        ]
    )


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arm = verdict["rule_spec"]["roles"]["burst"]["arm"].lower()
    pinfo = verdict.get("predictions") or {}
    preds = None
    if pinfo.get("path"):
        try:
            preds = Predictions.load(pinfo["path"])
        except Exception:
            preds = None
    rates = list(verdict["registered_rates"])
    width = float(verdict["rule_spec"]["params"]["completions_bin"])  # the spec's figure bin
    fig, axes = plt.subplots(2, len(rates), figsize=(6.2 * len(rates), 6.4), sharex=True, squeeze=False)
    cols = ["#d35400", "#a04000", "#f39c12"]
    for j, rate in enumerate(rates):
        top, bot = axes[0][j], axes[1][j]
        for a in analyzed:
            if a.series is None or abs(a.run.rate - rate) > 1e-9:
                continue
            s = a.series
            is_b = a.run.arm.lower() == arm
            c = cols[a.run.seed % 3] if is_b else "0.6"
            top.step(s["completions_t"] + width / 2, s["completions"], where="mid", color=c, lw=1.0 if is_b else 0.7)
            # means of sessions in the system over the same bins
            k = max(1, round(width / np.diff(s["backlog_t"][:2]).sum())) if len(s["backlog_t"]) > 1 else 1
            n = len(s["in_system"]) // k * k
            bot.plot(
                s["backlog_t"][:n].reshape(-1, k).mean(axis=1),
                s["in_system"][:n].reshape(-1, k).mean(axis=1),
                color=c,
                lw=1.0,
            )
            tr = preds.trajectory(a.run.arm, a.run.rate, a.run.seed) if preds and is_b else None
            if tr:
                t = np.asarray(tr["t"])
                bot.plot(t, np.asarray(tr["backlog"]), color=c, ls="--", lw=0.9)
                w = width / max(1e-9, float(t[1] - t[0])) if len(t) > 1 else 1
                kk = max(1, round(w))
                m = len(t) // kk * kk
                top.step(
                    t[:m].reshape(-1, kk).mean(axis=1),
                    np.asarray(tr["completions"])[:m].reshape(-1, kk).mean(axis=1),
                    where="mid",
                    color=c,
                    ls="--",
                    lw=0.8,
                )
        top.set_title(f"{rate:g} × λref")
        top.set_ylabel(f"completions (λref, {width:g} s)")
        bot.set_ylabel(f"sessions in system ({width:g} s means)")
        bot.set_xlabel("time since start of run (s)")
    fig.text(0.5, 0.005, "colour: BURST seeds; grey: NOBURST controls; dashed: model F frozen", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
