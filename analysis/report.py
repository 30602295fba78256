"""Run directories -> registered verdict: JSON, a Markdown table in the layout of the paper's
Table 7, a per-run table, and a figure in the layout of its Fig. 1.

The analysis reads only what the runs recorded (meta.json and the row tables), with the rule spec
and the references as explicit inputs, so the same report can be recomputed by anyone from the
run directories and the frozen rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from analysis.metrics import MetricSpec, run_series, run_statistics
from analysis.openloop import report_lines, run_open_loop, verdict_block
from analysis.rules import STATE_LETTER, RuleError, RunVerdict, is_staged, judge_run, judge_test, load_rule
from harness.recording.record import RunFormatError, load_run

ARM_ORDER = ["BURST", "NOBURST", "CAPPED"]


@dataclass
class AnalyzedRun:
    verdict: RunVerdict
    series: dict[str, np.ndarray] | None
    open_loop: dict[str, Any] | None = None  # start-lateness summary (analysis/openloop.py)


def _refs_from_meta(meta: Mapping[str, Any], override: Mapping[str, float] | None) -> dict[str, float]:
    refs = dict(meta.get("references") or {})
    if override:
        refs.update(override)
    lam_ref = float(refs["lambda_ref"])
    rate = float(meta["rate"])
    return {
        "lam": rate * lam_ref,
        "lam_miss": lam_ref,
        "all_miss_rate": float(refs["all_miss_token_rate"]),
        "rate": rate,
        "lambda_ref": lam_ref,
    }


def analyze_run(
    run_dir: Path | str, spec: Mapping[str, Any], refs_override: Mapping[str, float] | None = None, series: bool = True
) -> AnalyzedRun:
    """One run's verdict (and its figure series). A run that cannot be read is MISSING."""
    try:
        run = load_run(run_dir)
    except (RunFormatError, OSError) as exc:
        name = Path(run_dir).name
        return AnalyzedRun(
            RunVerdict(name, float("nan"), -1, "MISSING", False, reason=str(exc), run_dir=str(run_dir)), None
        )
    meta = run.meta
    p = meta["protocol"]
    params = spec["params"]
    mspec = MetricSpec(
        window_start=float(p["window"]["start"]),
        window_end=float(p["window"]["end"]),
        duration=float(p["duration"]),
        backlog_bin=float(params["backlog_bin"]),
        recovered_span=float(params["recovered_span"]),
        hit_threshold=float(params["hit_threshold"]),
        outstanding_stat=str(params.get("outstanding_stat", "mean")),
    )
    refs = _refs_from_meta(meta, refs_override)
    status = {"COMPLETED": "complete"}.get(run.status, run.status)
    if run.partial and status == "complete":
        status = "PARTIAL"
    stats = run_statistics(run.turns, run.sessions, run.gate_events, mspec)
    stats["token_ratio"] = stats["token_rate"] / refs["all_miss_rate"]
    stats["slope_threshold"] = float(params["slope_factor"]) * (refs["lam"] - refs["lam_miss"])
    stats["completions_ref"] = stats["sessions_completed_rate"] / refs["lambda_ref"]
    stats["base_arrivals_ref"] = stats["base_arrival_rate_window"] / refs["lambda_ref"]
    stats["wall_s"] = meta.get("wall_s")
    v = judge_run(
        meta["arm"],
        float(meta["rate"]),
        int(meta["seed"]),
        stats,
        refs,
        spec,
        status=status,
        reason=meta.get("status_reason") or "",
        run_dir=str(run_dir),
    )
    ser = None
    if series:
        ser = run_series(
            run.turns,
            run.sessions,
            run.gate_events,
            mspec.duration,
            float(p.get("hit_bin", 100.0)),
            mspec.backlog_bin,
            mspec.hit_threshold,
        )
    return AnalyzedRun(v, ser, run_open_loop(meta, run.sessions))


def analyze(
    run_dirs: Sequence[Path | str],
    *,
    rule: str | Path | Mapping[str, Any] | None = None,
    arms: Sequence[str] | None = None,
    rates: Sequence[float] | None = None,
    seeds: Sequence[int] | None = None,
    refs_override: Mapping[str, float] | None = None,
    test_name: str | None = None,
) -> tuple[dict[str, Any], list[AnalyzedRun]]:
    """The test verdict over `run_dirs`. Arms, rates and seeds default to those the runs name;
    pass the registered ones so a missing run is counted as missing, not silently absent."""
    spec = load_rule(rule)
    if is_staged(spec):
        raise RuleError(
            f"rule {spec['name']!r} is a staged family: judge it with analysis.staged_analysis.analyze_staged "
            "(analysis.judge.report_runs dispatches on analysis.rules.is_staged)"
        )
    analyzed = [analyze_run(d, spec, refs_override) for d in run_dirs]
    runs = [a.verdict for a in analyzed]
    metas = [_meta(d) for d in run_dirs]
    arms = list(arms) if arms else _ordered_arms({r.arm for r in runs if r.state != "MISSING"})
    rates = list(rates) if rates else sorted({r.rate for r in runs if not math.isnan(r.rate)})
    seeds = list(seeds) if seeds else sorted({r.seed for r in runs if r.seed >= 0})
    out = judge_test(runs, arms, rates, seeds, spec)
    ref_block = next((m.get("references") for m in metas if m and m.get("references")), None)
    out = {
        "test": test_name or next((m.get("test") for m in metas if m), None),
        **out,
        "arms": arms,
        "registered_rates": rates,
        "seeds": seeds,
        "references": {**(ref_block or {}), **(refs_override or {})},
        "rule_spec": spec,
        "runs": [r.to_json() for r in runs],
        "open_loop": verdict_block(
            [
                (Path(a.verdict.run_dir).name, a.verdict.arm, a.verdict.rate, a.verdict.seed, a.open_loop)
                for a in analyzed
            ]
        ),
    }
    return out, analyzed


def _meta(d: Path | str) -> dict[str, Any] | None:
    try:
        return orjson.loads((Path(d) / "meta.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _ordered_arms(names: set[str]) -> list[str]:
    known = [a for a in ARM_ORDER if any(n.upper() == a for n in names)]
    key = {n.upper(): n for n in names}
    return [key[a] for a in known] + sorted(n for n in names if n.upper() not in ARM_ORDER)


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
    if state == "RECOVERED" and arm.upper() == "NOBURST":
        return "G"
    return STATE_LETTER.get(state, "?")


def markdown_table(verdict: Mapping[str, Any]) -> str:
    """Table 7 layout: per rate and arm, the seed states and ranges over seeds."""
    runs = verdict["runs"]
    refs = verdict.get("references", {})
    lines = [
        f"### {verdict.get('test') or 'test'}: {verdict['verdict']}",
        "",
        f"λ_ref = {refs.get('lambda_ref', '?')} sessions/s, all-miss rate = {refs.get('all_miss_token_rate', '?')} tokens/s; "
        f"states for seeds {', '.join(str(s) for s in verdict['seeds'])}: T trapped, I indeterminate, D draining, "
        "G good, R recovered, F failed, X window shorter than the rule allows, - missing. Window statistics; ranges over seeds; "
        "NOBURST and CAPPED slopes in absolute value.",
        "",
        "| λ/λref | arm | states | hit | tokens (× all-miss) | backlog | slope (s⁻¹) | slope thr. | stuck | rate verdict |",
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
            lines.append(
                f"| {rate:g} | {arm.upper()} | {states} | {_rng([x.get('hit') for x in st], '{:.3f}')} | "
                f"{_rng([x.get('token_ratio') for x in st], '{:.3f}')} | {_rng([x.get('backlog_mean') for x in st], '{:.1f}')} | "
                f"{_rng(slopes, '{:.4f}')} | {_rng([x.get('slope_threshold') for x in st], '{:.4f}')} | {stuck}/{len(rs)} | "
                f"{rv['verdict'] if i == 0 else ''} |"
            )
    lines.append("")
    for rv in verdict["rates"]:
        lines.append(f"- {rv['rate']:g} λ_ref: **{rv['verdict']}** — {rv['reason']}")
    return "\n".join(lines)


def runs_table(verdict: Mapping[str, Any]) -> str:
    """One row per run, with every input of the rule and the failing conditions named."""
    span = f"{float((verdict.get('rule_spec') or {}).get('params', {}).get('recovered_span', 300.0)):g}"  # the rule's last span
    lines = [
        f"| λ/λref | arm | seed | state | stuck | hit | follow-up hit | tokens × all-miss | backlog | slope | hit last {span} s | outstanding last {span} s | completions × λref | base arrivals × λref | gate waited | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    key = {a.upper(): i for i, a in enumerate(verdict["arms"])}
    for r in sorted(verdict["runs"], key=lambda r: (r["rate"], key.get(r["arm"].upper(), 99), r["seed"])):
        s = r["stats"] or {}

        def f(k: str, fmt: str) -> str:
            v = s.get(k)
            return "-" if v is None else fmt.format(v)

        lines.append(
            f"| {r['rate']:g} | {r['arm'].upper()} | {r['seed']} | {r['state']} | {'yes' if r['flags'].get('stuck') else 'no'} | "
            f"{f('hit', '{:.3f}')} | {f('followup_hit', '{:.3f}')} | {f('token_ratio', '{:.3f}')} | {f('backlog_mean', '{:.1f}')} | "
            f"{f('slope', '{:+.4f}')} | {f('hit_last', '{:.3f}')} | {f('outstanding_last', '{:.1f}')} | {f('completions_ref', '{:.2f}')} | "
            f"{f('base_arrivals_ref', '{:.2f}')} | {f('gate_waited', '{}')} | {f('wall_s', '{:.0f}')} |"
        )
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


def figure(verdict: Mapping[str, Any], analyzed: Sequence[AnalyzedRun], path: Path | str) -> Path:
    """Fig. 1 layout: one column per rate; top hit fraction per window, bottom sessions in system (log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(verdict["registered_rates"])
    meta_any = verdict.get("references", {})
    fig, axes = plt.subplots(2, max(1, len(rates)), figsize=(6.2 * max(1, len(rates)), 6.4), sharex=True, squeeze=False)
    runs = [a for a in analyzed if a.series is not None]
    proto = None
    for a in runs:
        m = _meta(a.verdict.run_dir)
        if m:
            proto = m["protocol"]
            break
    for j, rate in enumerate(rates):
        top, bot = axes[0][j], axes[1][j]
        for a in runs:
            v = a.verdict
            if v.rate != rate:
                continue
            c = ARM_COLORS.get(v.arm.upper(), "gray")
            ls = ARM_STYLES.get(v.arm.upper(), "-")
            s = a.series
            top.plot(s["hit_t"] + 0.5 * np.diff(s["hit_t"][:2]).sum(), s["hit"], color=c, ls=ls, lw=0.9, alpha=0.85)
            bot.plot(s["backlog_t"], np.maximum(s["in_system"], 0.8), color=c, ls=ls, lw=0.9, alpha=0.85)
        lam = rate * float(meta_any.get("lambda_ref", float("nan")))
        top.set_title(f"{rate:g} × λref (λ = {lam:.4f} sessions/s)")
        top.set_ylim(-0.02, 1.02)
        top.set_ylabel("prefix-cache hit fraction")
        bot.set_yscale("log")
        bot.set_ylabel("sessions in system")
        bot.set_xlabel("time since start of run (s)")
        if proto:
            for ax in (top, bot):
                ax.axvspan(proto["window"]["start"], proto["window"]["end"], color="0.9", zorder=0)
                if proto["burst"]["size"]:
                    ax.axvline(proto["burst"]["time"], color="0.3", ls="--", lw=0.8)
    handles = [
        plt.Line2D([], [], color=ARM_COLORS[a], ls=ARM_STYLES.get(a, "-"), label=a)
        for a in ARM_ORDER
        if any(x.verdict.arm.upper() == a for x in runs)
    ]
    if handles:  # no run with data (all failed): an empty figure, not a crash
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False)
    fig.text(0.5, 0.005, "one line per seed; shaded: evaluation window; dashed: burst", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(verdict: Mapping[str, Any], analyzed: Sequence[AnalyzedRun], out_dir: Path | str) -> dict[str, Path]:
    """verdict.json, report.md (both tables) and figure.png in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vj = out / "verdict.json"
    vj.write_bytes(orjson.dumps(verdict, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    md = out / "report.md"
    md.write_text(
        markdown_table(verdict) + "\n\n#### Per run\n\n" + runs_table(verdict) + "\n\n![figure](figure.png)\n"
    )
    png = figure(verdict, analyzed, out / "figure.png")
    return {"verdict": vj, "report": md, "figure": png}
