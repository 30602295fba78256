"""Rescue R1 / R4 (App. E.7): Table 9's per-run layout and Fig. 3's (follow-up hit fraction and
outstanding work of the rescue runs against their controls, with t_on and each release)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analysis.reports.common import bin_mid, header, label, num, outcome_block, per_run_table, q, runs_of, table

COLUMNS = [
    ("follow-up hit [t_on, end)", "control_hit_after", "{:.3f}"),
    ("hit last 300 s", "hit_last", "{:.3f}"),
    ("failed sessions", "failed_sessions", "{:.0f}"),
    ("unmatched pauses", "gate.unmatched_pauses", "{:.0f}"),
]


def markdown(verdict: Mapping[str, Any]) -> str:
    rescue_arm = verdict["rule_spec"]["roles"]["rescue"]["arm"]
    control_arm = verdict["rule_spec"]["roles"]["control"]["arm"]
    amr = (verdict.get("references") or {}).get("all_miss_token_rate") or float("nan")
    rows = []
    for rate in verdict["registered_rates"]:
        rr, cr = runs_of(verdict, rescue_arm, rate), runs_of(verdict, control_arm, rate)
        for s in verdict["seeds"]:
            r = rr.get(s)
            pt = q(r, "post_tokens")
            rows.append(
                [
                    num(rate, "{:g}"),
                    str(s),
                    num(q(r, "pre_hit"), "{:.3f}"),
                    num(q(r, "outstanding_on"), "{:.0f}"),
                    num(q(r, "gate.release"), "{:.0f}"),
                    num(q(r, "gate.paused_sessions"), "{:.0f}"),
                    num(q(r, "gate.max_held"), "{:.0f}"),
                    num(q(r, "gate.delay_h"), "{:.1f}"),
                    num(q(r, "post.min"), "{:.3f}"),
                    num(q(r, "post.whole"), "{:.3f}"),
                    num(pt / amr if isinstance(pt, float) else None, "{:.2f}"),
                    label(r, "rescue"),
                    "yes" if r and r.get("flags", {}).get("relapse") else "no",
                    label(cr.get(s), "control"),
                ]
            )
    head = [
        "λ/λref",
        "seed",
        "follow-up hit before t_on",
        "outstanding at t_on",
        "t_rel (s)",
        "paused",
        "held",
        "delay (h)",
        "lowest 300 s after",
        "follow-up hit after",
        "tokens × all-miss after",
        "rescue",
        "relapse",
        "control",
    ]
    lines = [
        *header(verdict, "rescue"),
        "After = over [t_rel + 300, 8700) s. Outstanding: requests in flight plus sessions held at the gate or paused. "
        "Delay: session-hours of admission waits and pauses. Control: the same-seed BURST run, STUCK if its follow-up "
        "hit over [t_on, 8700) is below 0.2 and it is not RECOVERED.",
        "",
        *table(head, rows),
        "",
        outcome_block(verdict),
        "",
        "#### Per run",
        "",
        *per_run_table(verdict, COLUMNS, ["valid", "released", "postgood", "rescue", "control"]),
    ]
    return "\n".join(lines)


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    roles = verdict["rule_spec"]["roles"]
    colors = {
        roles["rescue"]["arm"].lower(): "#239b56",
        roles["control"]["arm"].lower(): "#c0392b",
        "noburst": "#2471a3",
    }
    rates = list(verdict["registered_rates"])
    fig, axes = plt.subplots(2, len(rates), figsize=(6.2 * len(rates), 6.4), sharex=True, squeeze=False)
    t_on = float(verdict["rule_spec"]["params"]["t_on"])
    for j, rate in enumerate(rates):
        top, bot = axes[0][j], axes[1][j]
        for a in analyzed:
            if a.series is None or abs(a.run.rate - rate) > 1e-9:
                continue
            c = colors.get(a.run.arm.lower(), "gray")
            s = a.series
            ctl = a.run.arm.lower() == "noburst"  # the reference, drawn faint and beneath
            kw = {"lw": 0.6 if ctl else 0.9, "alpha": 0.45 if ctl else 0.85, "zorder": 1 if ctl else 2}
            top.plot(bin_mid(s["hit_t"]), s["followup_hit"], color=c, **kw)
            bot.plot(s["backlog_t"], np.maximum(s["outstanding_paused"], 0.8), color=c, **kw)
            rel = a.run.quantities.get("gate.release")
            if a.run.arm.lower() == roles["rescue"]["arm"].lower() and isinstance(rel, float) and np.isfinite(rel):
                for ax in (top, bot):
                    ax.axvline(rel, color=c, ls=":", lw=0.8)
        for ax in (top, bot):
            ax.axvline(t_on, color="0.3", ls="--", lw=0.8)
        top.set_title(f"{rate:g} × λref")
        top.set_ylim(-0.02, 1.02)
        top.set_ylabel("follow-up hit fraction (100 s)")
        bot.set_yscale("log")
        bot.set_ylabel("outstanding (in flight + held + paused)")
        bot.set_xlabel("time since start of run (s)")
    handles = [Line2D([], [], color=v, label=k) for k, v in colors.items()]
    fig.legend(handles=handles, loc="upper center", ncol=3, frameon=False)
    fig.text(0.5, 0.005, "dashed: cap engaged at t_on; dotted: each rescue run's release", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
