"""The paired test's report (E2, App. E.5): a Markdown table in the layout of the paper's Table 7,
a per-run table with every input of the rule and the failing conditions named, and a figure in the
layout of its Fig. 1. It reads the verdict analysis/paired.py lays out, and the analysed runs'
series for the figure; it judges nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.openloop import report_lines
from analysis.reports.common import LETTER, grid_figure, log_y, save_grid

ARM_ORDER = ["BURST", "NOBURST", "CAPPED"]


def markdown(verdict: Mapping[str, Any]) -> str:
    """report.md's text: the Table 7 layout, then one row per run."""
    return markdown_table(verdict) + "\n\n#### Per run\n\n" + runs_table(verdict)


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
def _rng(vals: Sequence[float], fmt: str) -> str:
    v = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return "-"
    lo, hi = min(v), max(v)
    a, b = fmt.format(lo), fmt.format(hi)
    return a if a == b else f"{a}–{b}"


def _letter(arm: str, state: str) -> str:
    """A run's state as the per-seed strings write it (Table 7 style, the letters every report uses:
    analysis.reports.common.LETTER); NOBURST's RECOVERED reads as G(ood)."""
    if state == "RECOVERED" and arm.upper() == "NOBURST":
        return "G"
    return LETTER.get(state, "?")


def markdown_table(verdict: Mapping[str, Any]) -> str:
    """Table 7 layout: per rate and arm, the seed states and ranges over seeds."""
    runs = verdict["runs"]
    refs = verdict.get("references", {})
    lines = [
        f"### {verdict.get('test') or 'test'}: {verdict['verdict']}",
        "",
        f"λ_ref = {refs.get('lambda_ref', '?')} sessions/s, "
        f"all-miss rate = {refs.get('all_miss_token_rate', '?')} tokens/s; "
        f"states for seeds {', '.join(str(s) for s in verdict['seeds'])}: T trapped, I indeterminate, D draining, "
        "G good, R recovered, F failed, X window shorter than the rule allows, - missing. Window statistics; "
        "ranges over seeds; NOBURST and CAPPED slopes in absolute value.",
        "",
        "| λ/λref | arm | states | hit | tokens (× all-miss) | backlog | slope (s⁻¹) | slope thr. | stuck "
        "| rate verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rv in verdict["rates"]:
        rate = rv["rate"]
        for i, arm in enumerate(verdict["arms"]):
            rs = {r["seed"]: r for r in runs if r["arm"].upper() == arm.upper() and r["rate"] == rate}
            states = "".join(_letter(arm, rs[s]["state"]) if s in rs else "-" for s in verdict["seeds"])
            st = [rs[s]["stats"] for s in verdict["seeds"] if s in rs and rs[s]["stats"]]
            stuck = sum(1 for s in verdict["seeds"] if s in rs and rs[s]["flags"].get("stuck"))
            slopes = [x.get("slope") for x in st]
            if arm.upper() != "BURST":
                slopes = [abs(x) for x in slopes if x is not None]
            cols = [
                _rng([x.get("hit") for x in st], "{:.3f}"),
                _rng([x.get("token_ratio") for x in st], "{:.3f}"),
                _rng([x.get("backlog_mean") for x in st], "{:.1f}"),
                _rng(slopes, "{:.4f}"),
                _rng([x.get("slope_threshold") for x in st], "{:.4f}"),
                f"{stuck}/{len(rs)}",
                rv["verdict"] if i == 0 else "",
            ]
            lines.append(f"| {rate:g} | {arm.upper()} | {states} | " + " | ".join(cols) + " |")
    lines.append("")
    for rv in verdict["rates"]:
        lines.append(f"- {rv['rate']:g} λ_ref: **{rv['verdict']}** — {rv['reason']}")
    return "\n".join(lines)


# The per-run table's statistics after the state columns: (statistic, format).
RUN_COLUMNS = [
    ("hit", "{:.3f}"),
    ("followup_hit", "{:.3f}"),
    ("token_ratio", "{:.3f}"),
    ("backlog_mean", "{:.1f}"),
    ("slope", "{:+.4f}"),
    ("hit_last", "{:.3f}"),
    ("outstanding_last", "{:.1f}"),
    ("completions_ref", "{:.2f}"),
    ("base_arrivals_ref", "{:.2f}"),
    ("gate_waited", "{}"),
    ("wall_s", "{:.0f}"),
]


def _stat(stats: Mapping[str, Any], key: str, fmt: str) -> str:
    v = stats.get(key)
    return "-" if v is None else fmt.format(v)


def runs_table(verdict: Mapping[str, Any]) -> str:
    """One row per run, with every input of the rule and the failing conditions named."""
    span = f"{float(verdict['rule_spec']['params']['recovered_span']):g}"  # the rule's last span
    head = [
        "λ/λref",
        "arm",
        "seed",
        "state",
        "stuck",
        "hit",
        "follow-up hit",
        "tokens × all-miss",
        "backlog",
        "slope",
        f"hit last {span} s",
        f"outstanding last {span} s",
        "completions × λref",
        "base arrivals × λref",
        "gate waited",
        "wall s",
    ]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    key = {a.upper(): i for i, a in enumerate(verdict["arms"])}
    for r in sorted(verdict["runs"], key=lambda r: (r["rate"], key.get(r["arm"].upper(), 99), r["seed"])):
        s = r["stats"] or {}
        cols = [
            f"{r['rate']:g}",
            r["arm"].upper(),
            str(r["seed"]),
            r["state"],
            "yes" if r["flags"].get("stuck") else "no",
        ]
        cols += [_stat(s, k, fmt) for k, fmt in RUN_COLUMNS]
        lines.append("| " + " | ".join(cols) + " |")
    notes = []
    for r in verdict["runs"]:
        if not r["good"]:
            failing = {st: [c["condition"] for c in cs if not c["holds"]] for st, cs in r["conditions"].items() if cs}
            why = "; ".join(f"{st}: not ({', '.join(c)})" for st, c in failing.items() if c)
            notes.append(
                f"- {r['arm'].upper()} {r['rate']:g} seed {r['seed']}: {r['state']}. {why} {r['reason']}".rstrip()
            )
    if notes:
        lines += ["", "Runs whose arm condition does not hold:", *notes]
    lines += report_lines(verdict.get("open_loop"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# figure
# ---------------------------------------------------------------------------------------------
ARM_COLORS = {"BURST": "#c0392b", "NOBURST": "#2471a3", "CAPPED": "#239b56"}
ARM_STYLES = {"CAPPED": (0, (4, 2))}  # dashed: once its gate has drained, CAPPED lies on NOBURST


def figure(verdict: Mapping[str, Any], analyzed: Sequence[Any], path: Path | str) -> Path:
    """Fig. 1 layout: one column per rate; top hit fraction per window, bottom sessions in system (log)."""
    from matplotlib.lines import Line2D

    rates = list(verdict["registered_rates"])
    meta_any = verdict.get("references", {})
    fig, axes = grid_figure(2, max(1, len(rates)), sharex=True)
    runs = [a for a in analyzed if a.series is not None]
    proto = next((a.meta["protocol"] for a in runs if a.meta), None)
    for j, rate in enumerate(rates):
        top, bot = axes[0][j], axes[1][j]
        for a in runs:
            v = a.run
            if v.rate != rate:
                continue
            c = ARM_COLORS.get(v.arm.upper(), "gray")
            ls = ARM_STYLES.get(v.arm.upper(), "-")
            s = a.series
            top.plot(s["hit_t"] + 0.5 * np.diff(s["hit_t"][:2]).sum(), s["hit"], color=c, ls=ls, lw=0.9, alpha=0.85)
            bot.plot(s["backlog_t"], np.maximum(s["in_system"], 0.8), color=c, ls=ls, lw=0.9, alpha=0.85)
        lam = rate * float(meta_any.get("lambda_ref", float("nan")))
        top.set_title(f"{rate:g} × λref (λ = {lam:.4f} sessions/s)", y=1.0)  # analysis.reports.common.grid_figure
        top.set_ylim(-0.02, 1.02)
        top.set_ylabel("prefix-cache hit fraction")
        log_y(bot)
        bot.set_ylabel("sessions in system")
        bot.set_xlabel("time since start of run (s)")
        if proto:
            for ax in (top, bot):
                ax.axvspan(proto["window"]["start"], proto["window"]["end"], color="0.9", zorder=0)
                if proto["burst"]["size"]:
                    ax.axvline(proto["burst"]["time"], color="0.3", ls="--", lw=0.8)
    handles = [
        Line2D([], [], color=ARM_COLORS[a], ls=ARM_STYLES.get(a, "-"), label=a)
        for a in ARM_ORDER
        if any(x.run.arm.upper() == a for x in runs)
    ]
    if handles:  # no run with data (all failed): an empty figure, not a crash
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False)
    fig.text(0.5, 0.005, "one line per seed; shaded: evaluation window; dashed: burst", ha="center", fontsize=8)
    path = Path(path)
    save_grid(fig, path, dpi=120)
    return path
