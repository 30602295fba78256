"""Building blocks of the staged families' reports: number formats, the outcome block that says
why each group and the test are what they are, a per-run table, and the Fig. 1-style figure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

LETTER = {
    "STUCK": "S",
    "GOOD": "G",
    "NEITHER": "N",
    "TRAPPED": "T",
    "RECOVERED": "R",
    "DRAINING": "D",
    "INDETERMINATE": "I",
    "RESCUED": "R",
    "NOT-RESCUED": "x",
    "RENEWAL": "R",
    "CURVE": "C",
    "NOT-TRAPPED": "N",
    "MIXED": "M",
    "STABLE": "s",
    "UNSTABLE": "u",
    "MISSING": "-",
    "FAILED": "F",
    "INVALID": "X",
    "NOT-COUNTED": "X",
    "PARTIAL": "P",
    "NOT-STUCK": "n",
}


def num(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return fmt.format(v)
    return str(v)


def rng(vals: Sequence[Any], fmt: str = "{:.3f}") -> str:
    v = [x for x in vals if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]
    if not v:
        return "-"
    a, b = fmt.format(min(v)), fmt.format(max(v))
    return a if a == b else f"{a}–{b}"


def runs_of(
    verdict: Mapping[str, Any], arm: str | Sequence[str], rate: float | None = None
) -> dict[int, Mapping[str, Any]]:
    arms = [arm.lower()] if isinstance(arm, str) else [a.lower() for a in arm]
    return {
        r["seed"]: r
        for r in verdict["runs"]
        if r["arm"].lower() in arms and (rate is None or (r["rate"] is not None and abs(r["rate"] - rate) < 1e-9))
    }


def q(run: Mapping[str, Any] | None, key: str) -> Any:
    if not run:
        return None
    if key in run.get("derived", {}):
        return run["derived"][key]
    return run.get("quantities", {}).get(key)


def label(run: Mapping[str, Any] | None, lset: str) -> str:
    if not run:
        return "MISSING"
    if run["status"] not in ("complete", "NOT-COUNTED"):
        return str(run["status"])
    return str(run["labels"].get(lset) or "?")


def letters(verdict: Mapping[str, Any], arm: str | Sequence[str], rate: float | None, lset: str) -> str:
    rs = runs_of(verdict, arm, rate)
    return "".join(LETTER.get(label(rs.get(s), lset), "?") for s in verdict["seeds"])


def _cond(c: Mapping[str, Any]) -> str:
    mark = "✓" if c.get("holds") else "✗"
    if "lhs" in c:
        return f"{mark} `{c['condition']}` ({num(c['lhs'], '{:.4g}')} vs {num(c['rhs'], '{:.4g}')})"
    if "value" in c:
        return f"{mark} `{c['condition']}` (= {num(c['value'], '{:.4g}')})"
    return f"{mark} `{c['condition']}`"


def outcome_block(verdict: Mapping[str, Any]) -> str:
    """Per group: the outcome, the counts and every condition of the outcomes tried in order;
    then the test's outcome and checks."""
    lines = []
    for g in verdict["groups"]:
        head = f"- **{g['group']}{' × λref' if g['rate'] is not None else ''}: {g['outcome']}** — {g['reason']}"
        lines.append(head)
        if g["counts"]:
            lines.append("  - seed counts: " + ", ".join(f"{k} {v}/{len(g['seeds'])}" for k, v in g["counts"].items()))
        for name, conds in g["conditions"].items():
            if conds:
                lines.append(f"  - {name}: " + "; ".join(_cond(c) for c in conds))
        for name, c in g["checks"].items():
            lines.append(f"  - check {name}: " + _cond(c))
    lines.append(f"- **test: {verdict['verdict']}**")
    for name, conds in (verdict.get("test_conditions") or {}).items():
        if conds:
            lines.append(f"  - {name}: " + "; ".join(_cond(c) for c in conds))
    for name, c in (verdict.get("test_checks") or {}).items():
        lines.append(f"  - check {name}: " + _cond(c))
    return "\n".join(lines)


def header(verdict: Mapping[str, Any], title: str) -> list[str]:
    refs = verdict.get("references", {})
    spec = verdict.get("rule_spec", {})
    pred = verdict.get("predictions")
    out = [
        f"### {verdict.get('test') or title}: {verdict['verdict']}",
        "",
        f"Rule `{verdict['rule']}` (version {verdict.get('rule_version')}, {spec.get('description', '').strip()}). "
        f"λ_ref = {refs.get('lambda_ref', '?')} sessions/s, all-miss rate = {refs.get('all_miss_token_rate', '?')} "
        f"tokens/s; seeds {', '.join(str(s) for s in verdict['seeds'])}.",
    ]
    if pred:
        out.append(
            f"Predictions read from `{pred.get('path')}` (sha256 {str(pred.get('sha256'))[:12]}…, frozen "
            f"{pred.get('frozen_at')})."
        )
    out.append("")
    return out


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def per_run_table(
    verdict: Mapping[str, Any], columns: Sequence[tuple[str, str, str]], lsets: Sequence[str]
) -> list[str]:
    """One row per run: arm, rate, seed, status, the named label sets, then (title, key, format)."""
    head = ["arm", "λ/λref", "seed", *lsets, *(c[0] for c in columns)]
    rows = []
    for r in sorted(verdict["runs"], key=lambda r: (r["arm"], r["rate"] if r["rate"] is not None else 0, r["seed"])):
        rows.append(
            [
                r["arm"],
                num(r["rate"], "{:g}"),
                str(r["seed"]),
                *(label(r, s) for s in lsets),
                *(num(q(r, k), f) for _, k, f in columns),
            ]
        )
    notes = [
        f"- {r['arm']} {num(r['rate'], '{:g}')} seed {r['seed']}: {r['status']}: {r['reason']}"
        for r in verdict["runs"]
        if r["status"] != "complete" or r.get("reason")
    ]
    return [*table(head, rows), *(["", *notes] if notes else [])]


def bin_mid(t: np.ndarray) -> np.ndarray:
    """The middles of the bins that start at `t` (the series' own bin width, the protocol's hit_bin)."""
    return np.asarray(t + 0.5 * np.diff(t[:2]).sum())


COLORS = ["#c0392b", "#2471a3", "#239b56", "#8e44ad", "#d68910", "#17a589", "#7f8c8d"]


def arm_colors(arms: Sequence[str]) -> dict[str, str]:
    fixed = {"burst": "#c0392b", "noburst": "#2471a3", "capped": "#239b56"}
    out, i = {}, 0
    for a in arms:
        if a.lower() in fixed:
            out[a.lower()] = fixed[a.lower()]
        else:
            while COLORS[i % len(COLORS)] in fixed.values():
                i += 1
            out[a.lower()] = COLORS[i % len(COLORS)]
            i += 1
    return out


def grid_figure(rows: int, cols: int, *, col_width: float = 6.2, height: float = 6.4, **subplots: Any) -> Any:
    """(figure, axes[rows][cols]) on matplotlib's Agg canvas without pyplot.

    Why not pyplot: nothing here is interactive, and pyplot's import and figure manager cost a
    command about a quarter of a second; `savefig` renders a plain Figure to PNG through Agg.

    The grids set each column's title at y=1.0 (`set_title(..., y=1.0)`), where matplotlib leaves it
    when nothing stands above the axes, as in these grids; a title left to matplotlib makes every
    draw measure the axes' tick labels to see whether it must move up."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(col_width * cols, height))
    return fig, fig.subplots(rows, cols, squeeze=False, **subplots)


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
# What matplotlib's log formatter writes: a power of the base, or a coefficient times one
# ($\mathdefault{10^{2}}$, $\mathdefault{2\times10^{1}}$, either maybe signed)
_MATHTEXT_POWER = re.compile(r"\$\\mathdefault\{(-?)(?:([0-9.]+)\\times)?([0-9.]+)\^\{(-?[0-9]+)\}\}\$")


def plain_power(label: str) -> str:
    """A log axis label of matplotlib's as plain text with Unicode superscripts: 10², 2×10¹, 10⁻¹
    (any other label as given)."""
    m = _MATHTEXT_POWER.fullmatch(label)
    if m is None:
        return label
    sign, coeff, base, exponent = m.groups()
    return f"{sign}{coeff + '×' if coeff else ''}{base}{exponent.translate(_SUPERSCRIPT)}"


def log_y(ax: Any) -> None:
    """A log y axis labelled as matplotlib labels one (the same ticks and labels: 10⁰, 10¹, 10²),
    written in plain text with Unicode superscripts instead of mathtext. Why: the first mathtext
    label of a process builds mathtext's parser and loads its fonts, about 0.05 s of `analyze`'s
    figure (issue 24), for labels that need no more than a superscript."""
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLogFormatter(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_power(super().__call__(x, pos))

    ax.set_yscale("log")  # base 10 and the default locators; the formatters as LogScale sets them
    ax.yaxis.set_major_formatter(PlainLogFormatter(10))
    ax.yaxis.set_minor_formatter(PlainLogFormatter(10))


def save_grid(fig: Any, path: Any, *, dpi: int, top: float = 0.9, bottom: float = 0.095) -> None:
    """Fixed margins, then the PNG. Why not tight_layout: it measures every tick label's text to
    place the axes (about 0.6 s of a 1-2 s `analyze`), and these grids have the same labels every
    time: a y label and its ticks on the left, a title per column, the legend over them, a one-line
    note under the x label."""
    width = float(fig.get_size_inches()[0])
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.2 / width, top=top, bottom=bottom, wspace=0.16, hspace=0.1)
    # zlib level 2, not PIL's default 6: the same pixels, about half the encoding time (~0.08 s of a
    # 1488 x 768 grid) for a file ~6% larger
    fig.savefig(path, dpi=dpi, pil_kwargs={"compress_level": 2})


def hit_backlog_figure(
    verdict: Mapping[str, Any],
    analyzed: Sequence[Any],
    path: Any,
    *,
    title: str = "",
    marks: Callable[[Any, float], None] | None = None,
) -> Any:
    """Fig. 1 layout for any arms: per rate a column, hit fraction (per hit_bin) on top, sessions in the
    system (log) below, one line per run coloured by arm."""
    from matplotlib.lines import Line2D

    rates = list(verdict["registered_rates"]) or [None]
    fig, axes = grid_figure(2, len(rates), sharex=True)
    colors = arm_colors(verdict["arms"])
    for j, rate in enumerate(rates):
        top, bot = axes[0][j], axes[1][j]
        for a in analyzed:
            if a.series is None or (rate is not None and abs(a.run.rate - rate) > 1e-9):
                continue
            c = colors.get(a.run.arm.lower(), "gray")
            s = a.series
            top.plot(bin_mid(s["hit_t"]), s["hit"], color=c, lw=0.9, alpha=0.85)
            bot.plot(s["backlog_t"], np.maximum(s["in_system"], 0.8), color=c, lw=0.9, alpha=0.85)
        top.set_ylim(-0.02, 1.02)
        top.set_ylabel("prefix-cache hit fraction")
        top.set_title(f"{rate:g} × λref" if rate is not None else "all runs", y=1.0)  # see grid_figure
        log_y(bot)
        bot.set_ylabel("sessions in system")
        bot.set_xlabel("time since start of run (s)")
        if marks is not None:
            marks((top, bot), rate)
    handles = [Line2D([], [], color=colors[a.lower()], label=a) for a in verdict["arms"]]
    fig.legend(handles=handles, loc="upper center", ncol=max(1, len(handles)), frameon=False)
    if title:
        fig.text(0.5, 0.005, title, ha="center", fontsize=8)
    save_grid(fig, path, dpi=110)
    return path
