"""Parity of a simulated replay with the real run it replays: Markdown, JSON and a figure.

Compared, from the two runs' own records (the same measurement code as the verdicts):
- per turn (matched by session and turn): cached tokens equal, and hit (cached > half the prompt)
  equal;
- trajectories: hit fraction per `hit_bin`, sessions in the system per `backlog_bin`;
- distributions: session completions, turn latency and time to first byte quantiles;
- preemptions (the engines' counters, last gauge sample);
- with a rule spec: both runs' states by that rule and whether they match (sim2real/states.py),
  with the token rate over the all-miss rate, window hit, backlog and completions.

Each replay says where its costs came from (sim2real/replay.py): a fitted cost file, the run's own
(a simulated or emulated run), or the real run's meta.json on request (--cost-from-meta), which the
report marks beside the run: such a replay is not evidence about the engine.

Bands (named parameters, defaults stated in the report): a trajectory is within band when at least
`frac` of its bins differ by at most the tolerance -- hit fraction max(`hit_tol` absolute,
`hit_noise_z` binomial standard errors of the two bins' difference), backlog max(`backlog_abs`,
`backlog_rel` x the real value). Why the noise term: a bin's hit fraction is a count of hits over a
count of turns, and where a protocol's bins are short (the 0.5 s bins of a scaled protocol hold ~11
turns at 2 sessions/s, a standard error of ~0.11 each at hit 0.85) two runs whose every turn is a hit
or a miss alike differ by more than 0.10 in a quarter of the bins from where their turns end alone;
a fixed band would call that a trajectory out of band. `hit_noise_z` 0 is the fixed band.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics import hit_bin_counts, hit_fraction_from_counts, interval_bin_means, system_intervals
from harness.recording.record import load_run
from harness.recording.schema import HIT_THRESHOLD
from sim2real.states import compare_states

COST_MARK = {"meta": "costs from the run's meta.json (--cost-from-meta), not fitted to its engine and cell"}


@dataclass(frozen=True)
class Bands:
    hit_tol: float = 0.10
    backlog_abs: float = 5.0
    backlog_rel: float = 0.20
    frac: float = 0.80
    hit_noise_z: float = 2.0


def _edges(duration: float, width: float) -> np.ndarray:
    n = max(1, math.floor(duration / width + 1e-9))
    return width * np.arange(n + 1)


def _quantiles(x: pd.Series) -> dict[str, float]:
    v = x.dropna().to_numpy(float)
    if v.size == 0:
        return {"n": 0}
    q = np.quantile(v, [0.5, 0.9, 0.99])
    return {"n": int(v.size), "mean": float(v.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def _last(gauges: pd.DataFrame, col: str) -> float:
    if gauges is None or gauges.empty or col not in gauges.columns:
        return math.nan
    v = gauges[col].dropna()
    return float(v.iloc[-1]) if len(v) else math.nan


def _hit_tolerance(bands: Bands, hit_r: np.ndarray, hit_s: np.ndarray, n_r: np.ndarray, n_s: np.ndarray) -> np.ndarray:
    """Per bin: max(hit_tol, z x the binomial standard error of the difference of the two bins'
    fractions, at their pooled fraction)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled = (np.nan_to_num(hit_r) * n_r + np.nan_to_num(hit_s) * n_s) / np.maximum(n_r + n_s, 1)
        se = np.sqrt(pooled * (1 - pooled) * (1 / np.maximum(n_r, 1) + 1 / np.maximum(n_s, 1)))
    out: np.ndarray = np.maximum(bands.hit_tol, bands.hit_noise_z * np.nan_to_num(se))
    return out


def compare(
    real_dir: Path | str,
    sim_dir: Path | str,
    *,
    bands: Bands = Bands(),
    hit_bin: float | None = None,
    backlog_bin: float | None = None,
    spec: Mapping[str, Any] | None = None,
    rule_source: str = "",
) -> dict[str, Any]:
    """The parity of `sim_dir` (a replay) with `real_dir`; with `spec`, both runs' states by it."""
    real, sim = load_run(real_dir), load_run(sim_dir)
    meta = real.meta
    proto = meta.get("protocol") or {}
    duration = float(meta.get("end_time") or proto.get("duration") or max(real.turns["done_time"].max(), 1.0))
    hb = float(hit_bin or proto.get("hit_bin") or duration / 50)
    bb = float(backlog_bin or proto.get("backlog_bin") or duration / 200)
    rt = real.turns[real.turns["status"] == "ok"]
    st = sim.turns[sim.turns["status"] == "ok"]
    m = rt.merge(st, on=["session", "turn"], suffixes=("_real", "_sim"))
    cached_eq = float((m["cached_tokens_real"] == m["cached_tokens_sim"]).mean()) if len(m) else math.nan
    hr = m["cached_tokens_real"] > HIT_THRESHOLD * m["prompt_tokens_real"]
    hs = m["cached_tokens_sim"] > HIT_THRESHOLD * m["prompt_tokens_sim"]
    hit_eq = float((hr == hs).mean()) if len(m) else math.nan
    prompt_eq = float((m["prompt_tokens_real"] == m["prompt_tokens_sim"]).mean()) if len(m) else math.nan

    he = _edges(duration, hb)
    be = _edges(duration, bb)
    (n_r, h_r), (n_s, h_s) = hit_bin_counts(real.turns, he, HIT_THRESHOLD), hit_bin_counts(sim.turns, he, HIT_THRESHOLD)
    hit_r, hit_s = hit_fraction_from_counts(n_r, h_r), hit_fraction_from_counts(n_s, h_s)
    bl_r = interval_bin_means(*system_intervals(real.sessions), be)
    bl_s = interval_bin_means(*system_intervals(sim.sessions), be)
    both = ~np.isnan(hit_r) & ~np.isnan(hit_s)
    hit_tol = _hit_tolerance(bands, hit_r, hit_s, n_r, n_s)
    hit_in = float(np.mean(np.abs(hit_r - hit_s)[both] <= hit_tol[both])) if both.any() else math.nan
    tol = np.maximum(bands.backlog_abs, bands.backlog_rel * bl_r)
    bl_in = float(np.mean(np.abs(bl_r - bl_s) <= tol))

    def done(s: pd.DataFrame) -> int:
        return int(((s["outcome"] == "completed") & (s["end"] <= duration)).sum()) if not s.empty else 0

    report = {
        "real": str(real_dir),
        "sim": str(sim_dir),
        "arm": meta.get("arm"),
        "rate": meta.get("rate"),
        "seed": meta.get("seed"),
        "cell": (meta.get("cell") or {}).get("name"),
        "cost_file": (sim.meta.get("replay_of") or {}).get("cost_file"),
        "cost_source": (sim.meta.get("replay_of") or {}).get("source"),
        "quota_scaling": (sim.meta.get("replay_of") or {}).get("quota_scaling"),
        "duration": duration,
        "bands": asdict(bands),
        "turns": {
            "real": len(rt),
            "sim": len(st),
            "matched": len(m),
            "prompt_equal": prompt_eq,
            "cached_equal": cached_eq,
            "hit_equal": hit_eq,
        },
        "hit_fraction": {
            "bin_s": hb,
            "real_mean": float(np.nanmean(hit_r)) if np.any(~np.isnan(hit_r)) else math.nan,
            "sim_mean": float(np.nanmean(hit_s)) if np.any(~np.isnan(hit_s)) else math.nan,
            "max_abs_diff": float(np.nanmax(np.abs(hit_r - hit_s))) if both.any() else math.nan,
            "bins_within": hit_in,
            "within_band": bool(hit_in >= bands.frac) if both.any() else False,
        },
        "backlog": {
            "bin_s": bb,
            "real_end": float(bl_r[-1]),
            "sim_end": float(bl_s[-1]),
            "real_max": float(bl_r.max()),
            "sim_max": float(bl_s.max()),
            "bins_within": bl_in,
            "within_band": bool(bl_in >= bands.frac),
        },
        "completions": {"real": done(real.sessions), "sim": done(sim.sessions)},
        "latency_s": {"real": _quantiles(rt["latency"]), "sim": _quantiles(st["latency"])},
        "ttft_s": {"real": _quantiles(rt["ttft"]), "sim": _quantiles(st["ttft"])},
        "preemptions": {"real": _last(real.gauges, "preemptions_total"), "sim": _last(sim.gauges, "preemptions_total")},
        "series": {
            "hit_t": he[:-1].tolist(),
            "hit_real": hit_r.tolist(),
            "hit_sim": hit_s.tolist(),
            "backlog_t": (0.5 * (be[:-1] + be[1:])).tolist(),
            "backlog_real": bl_r.tolist(),
            "backlog_sim": bl_s.tolist(),
        },
    }
    if spec is not None:
        report["states"] = compare_states(real_dir, sim_dir, spec, rule_source)
    return report


def _f(v: Any, fmt: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt) if isinstance(v, (int, float)) else str(v)


def markdown(reports: list[dict[str, Any]]) -> str:
    b = reports[0]["bands"] if reports else asdict(Bands())
    lines = [
        "# Replay parity: the simulator against the real runs",
        "",
        f"Bands: a trajectory is within band when at least {b['frac']:.0%} of its bins differ by at most "
        f"max({b['hit_tol']:.2f}, {b.get('hit_noise_z', 0):g} binomial standard errors of the bins' difference) "
        f"(hit fraction) or max({b['backlog_abs']:g} sessions, {b['backlog_rel']:.0%}) (sessions in the system).",
        "",
        "| run | turns real/sim | cached equal | hit equal | hit real/sim | hit bins in band | backlog end real/sim | "
        "backlog bins in band | completions real/sim | latency p50 real/sim (s) | preemptions real/sim |",
        "| --- | --- | ---: | ---: | --- | ---: | --- | ---: | --- | --- | --- |",
    ]
    for r in reports:
        t, h, bl, c = r["turns"], r["hit_fraction"], r["backlog"], r["completions"]
        name = _name(r)
        lines.append(
            f"| {name} | {t['real']}/{t['sim']} | {_f(t['cached_equal'])} | {_f(t['hit_equal'])} | "
            f"{_f(h['real_mean'])}/{_f(h['sim_mean'])} "
            f"| {_f(h['bins_within'], '.2f')}{' ✓' if h['within_band'] else ' ✗'} | "
            f"{_f(bl['real_end'], '.1f')}/{_f(bl['sim_end'], '.1f')} "
            f"| {_f(bl['bins_within'], '.2f')}{' ✓' if bl['within_band'] else ' ✗'} | {c['real']}/{c['sim']} "
            f"| {_f(r['latency_s']['real'].get('p50'), '.3f')}/{_f(r['latency_s']['sim'].get('p50'), '.3f')} "
            f"| {_f(r['preemptions']['real'], '.0f')}/{_f(r['preemptions']['sim'], '.0f')} |"
        )
    files = sorted({str(r["cost_file"]) for r in reports if r.get("cost_file")})
    if files:
        lines += ["", f"Cost model of the replays: {', '.join(f'`{f}`' for f in files)}."]
    scaled = [r for r in reports if r.get("quota_scaling")]
    if scaled:
        q0 = scaled[0]["quota_scaling"]["cost_quota"]
        each = ", ".join(f"{_name(r)} x{r['quota_scaling']['factor']:.3f}" for r in scaled)
        lines += [
            "",
            f"Quota-scaled cost (it holds at {q0:g} CPU): each run replayed at speed x its recorded quota / {q0:g}: "
            f"{each}.",
        ]
    marked = [_name(r) for r in reports if r.get("cost_source") in COST_MARK]
    if marked:
        lines += ["", f"**Marked** ({COST_MARK['meta']}): {', '.join(marked)}."]
    lines += states_table(reports)
    return "\n".join(lines) + "\n"


def _name(r: Mapping[str, Any]) -> str:
    return f"{r['arm']} r{r['rate']} s{r['seed']}"


def states_table(reports: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: every run and its replay classed by the rule (empty when none was)."""
    rows = [r for r in reports if r.get("states")]
    if not rows:
        return []
    lines = [
        "",
        "## States by the registered rule",
        "",
        "| run | rule | state real / sim | match | token rate x all-miss real / sim | window hit real / sim | "
        "backlog end real / sim | completions / lambda_ref real / sim | costs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        st = r["states"]
        a, b = st["real"], st["sim"]

        def state(x: Mapping[str, Any]) -> str:
            return str(x["state"] if x["status"] == "complete" else f"{x['status']}")

        lines.append(
            f"| {_name(r)} | {st['rule']} ({st['rule_source']}) | {state(a)} / {state(b)} | "
            f"{'✓' if st['match'] else '✗'} | {_f(a['token_ratio'])} / {_f(b['token_ratio'])} | "
            f"{_f(a['hit'])} / {_f(b['hit'])} | {_f(a['backlog_end'], '.1f')} / {_f(b['backlog_end'], '.1f')} | "
            f"{_f(a['completions_ref'])} / {_f(b['completions_ref'])} | "
            f"{'**meta (marked)**' if r.get('cost_source') == 'meta' else (r.get('cost_source') or '-')} |"
        )
    n = sum(1 for r in rows if r["states"]["match"])
    lines += ["", f"States match in {n} of {len(rows)} runs."]
    return lines + margins_table(rows)


def margins_table(reports: list[dict[str, Any]]) -> list[str]:
    """The replays' flip margins (`agentload replay --margins`, sim2real/replay_margin.py); none
    where they were not asked for."""
    rows = [r for r in reports if r.get("margin")]
    if not rows:
        return []

    def side(x: Any, cap: float) -> str:
        return f"> {cap:.2f}" if x is None else f"{x:.3f}"

    lines = [
        "",
        "## Flip margins of the replayed states",
        "",
        "The smallest relative change of the cost's speed, each way, that changes the replayed state (the "
        "all-miss token reference moving with it); knife-edge where it is within the calibration's noise.",
        "",
        "| run | sim state | faster | slower | noise | label |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        m = r["margin"]
        nz = "-" if m.get("noise") is None else f"{m['noise']:.3f}"
        lines.append(
            f"| {_name(r)} | {m['base']} | {side(m['faster'], m['max_change'])} | {side(m['slower'], m['max_change'])} "
            f"| {nz} | {m['label']} |"
        )
    knife = [_name(r) for r in rows if r["margin"]["label"] == "knife-edge"]
    lines += ["", f"Knife-edge: {', '.join(knife) if knife else 'none'} ({len(knife)} of {len(rows)} runs)."]
    return lines


def figure(reports: list[dict[str, Any]], path: Path | str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(reports)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 5.6), squeeze=False)
    for j, r in enumerate(reports):
        s = r["series"]
        ax = axes[0][j]
        ax.plot(s["hit_t"], s["hit_real"], drawstyle="steps-post", label="real", color="k")
        ax.plot(s["hit_t"], s["hit_sim"], drawstyle="steps-post", label="replay", color="tab:orange")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"{r['arm']} r{r['rate']} s{r['seed']}", fontsize=9)
        if j == 0:
            ax.set_ylabel("hit fraction")
            ax.legend(fontsize=8)
        ax = axes[1][j]
        ax.plot(s["backlog_t"], s["backlog_real"], color="k")
        ax.plot(s["backlog_t"], s["backlog_sim"], color="tab:orange")
        ax.set_xlabel("time (s)")
        if j == 0:
            ax.set_ylabel("sessions in system")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(reports: list[dict[str, Any]], out_dir: Path | str) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parity.json").write_text(json.dumps(reports, indent=1, default=float))
    (out / "parity.md").write_text(markdown(reports))
    return {"json": out / "parity.json", "markdown": out / "parity.md", "figure": figure(reports, out / "parity.png")}
