"""The figures of the HTML page: the data of the interactive Fig. 1-style charts (hit fraction and
sessions in the system over time, one column per rate, one line per run), and images embedded as
data URIs.

The series are computed by the same function the Markdown report's figure uses
(`analysis.metrics.run_series`, with the rule's bins and hit threshold), from the run
directories the verdict judged, so the interactive chart and the static PNG show the same numbers.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from analysis.metrics import run_series
from analysis.reports.e2 import ARM_COLORS, ARM_ORDER
from harness.recording.record import RunFormatError, load_run

PALETTE = ["#8e44ad", "#d68910", "#17a589", "#7f8c8d", "#2e4053", "#a04000"]
DASHED = {"CAPPED"}  # once its gate has drained, CAPPED lies on NOBURST: dashed keeps both visible


def data_uri(path: Path, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def arm_color(arm: str, arms: Sequence[str]) -> str:
    a = arm.upper()
    if a in ARM_COLORS:
        return ARM_COLORS[a]
    others = [x.upper() for x in arms if x.upper() not in ARM_COLORS]
    return PALETTE[others.index(a) % len(PALETTE)] if a in others else PALETTE[-1]


def resolve_run_dir(run_dir: str, testdir: Path) -> Path | None:
    """A verdict's run directory, or the one of the same name in the test directory when the
    verdict was written elsewhere (a moved test directory, a judge in a temporary worktree)."""
    p = Path(run_dir)
    if (p / "meta.json").is_file():
        return p
    for cand in (testdir / "runs" / p.name, testdir / p.name):
        if (cand / "meta.json").is_file():
            return cand
    return None


def _clean(values: Any, digits: int) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        f = float(v)
        out.append(None if not math.isfinite(f) else round(f, digits))
    return out


def run_state(r: Mapping[str, Any]) -> str:
    """A judged run's state in words: the E2 state, or a staged run's labels, or its status."""
    if r.get("state"):
        return str(r["state"])
    labels = r.get("labels") or {}
    if labels and r.get("status") in ("complete", None):
        return ", ".join(f"{k} {v}" for k, v in labels.items())
    return str(r.get("status") or "?")


def fig1_charts(verdict: Mapping[str, Any], testdir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """One chart spec per rate (two panels: hit fraction, sessions in system on a log axis), and
    notes on runs that could not be drawn."""
    params = (verdict.get("rule_spec") or {}).get("params") or {}
    missing = [k for k in ("backlog_bin", "hit_threshold") if k not in params]
    if missing:  # the bins and the hit threshold are the rule's: without them nothing is drawn
        return [], [f"the verdict's rule spec has no {' or '.join(missing)}: no chart is drawn"]
    backlog_bin = float(params["backlog_bin"])
    threshold = float(params["hit_threshold"])
    arms = list(verdict.get("arms") or [])
    rates = list(
        verdict.get("registered_rates")
        or sorted({r["rate"] for r in verdict.get("runs") or [] if r.get("rate") is not None})
    )
    refs = verdict.get("references") or {}
    notes: list[str] = []
    per_rate: dict[float, list[dict[str, Any]]] = {float(r): [] for r in rates}
    proto: dict[str, Any] | None = None
    order = {a: i for i, a in enumerate(ARM_ORDER)}
    runs = sorted(
        verdict.get("runs") or [],
        key=lambda r: (order.get(str(r.get("arm", "")).upper(), 9), str(r.get("arm")), r.get("seed") or 0),
    )
    for r in runs:
        if r.get("rate") is None or float(r["rate"]) not in per_rate:
            continue
        d = resolve_run_dir(str(r.get("run_dir") or ""), testdir)
        if d is None:
            notes.append(
                f"{r.get('arm')} {r.get('rate')} seed {r.get('seed')}: no run directory to draw "
                f"({r.get('run_dir') or 'none recorded'})"
            )
            continue
        try:
            run = load_run(d)
        except (RunFormatError, OSError) as exc:
            notes.append(f"{d.name}: cannot be read ({exc})")
            continue
        p = run.meta.get("protocol") or {}
        if "duration" not in p or "hit_bin" not in p:
            notes.append(f"{d.name}: its meta.json protocol has no duration or hit_bin; not drawn")
            continue
        proto = proto or p
        hb = float(p["hit_bin"])
        s = run_series(run.turns, run.sessions, run.gate_events, float(p["duration"]), hb, backlog_bin, threshold)
        arm = str(r["arm"]).upper()
        label = f"{arm} seed {r.get('seed')} ({run_state(r)})"
        common = {"group": arm, "color": arm_color(arm, arms), "dash": arm in DASHED, "label": label}
        per_rate[float(r["rate"])] += [
            {
                **common,
                "panel": 0,
                "what": "hit fraction",
                "x": _clean(s["hit_t"] + 0.5 * hb, 1),
                "y": _clean(s["hit"], 4),
            },
            {
                **common,
                "panel": 1,
                "what": "sessions in system",
                "x": _clean(s["backlog_t"], 1),
                "y": _clean(s["in_system"], 2),
            },
        ]
    charts = []
    for rate, series in per_rate.items():
        if not series:
            continue
        dur = float((proto or {}).get("duration") or max(max(x for x in s["x"] if x is not None) for s in series))
        top = max([v for s in series if s["panel"] == 1 for v in s["y"] if v is not None] + [10.0])
        lam = rate * float(refs["lambda_ref"]) if refs.get("lambda_ref") else None
        bands, vlines = [], []
        if proto:
            w = proto.get("window") or {}
            if w.get("start") is not None:
                bands.append({"x0": float(w["start"]), "x1": float(w.get("end", dur))})
            b = proto.get("burst") or {}
            if b.get("size"):
                vlines.append({"x": float(b["time"])})
        charts.append(
            {
                "title": f"{rate:g} × λref" + (f" (λ = {lam:.4f} sessions/s)" if lam else ""),
                "rate": rate,
                "xlabel": "time since start of run (s)",
                "xmin": 0.0,
                "xmax": dur,
                "panels": [
                    {"ylabel": "prefix-cache hit fraction", "ymin": -0.02, "ymax": 1.02},
                    {
                        "ylabel": "sessions in system",
                        "ylog": True,
                        "ymin": 0.8,
                        "ymax": 10 ** math.ceil(math.log10(top * 1.2)),
                        "yfloor": 0.8,
                    },
                ],
                "bands": bands,
                "vlines": vlines,
                "series": series,
            }
        )
    return charts, notes


def json_script(obj: Any, element_id: str) -> str:
    """Data for the page's script: JSON in a non-executed script element, with '</' escaped so the
    data can never end the element early."""
    text = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode().replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'
