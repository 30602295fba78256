"""The iteration-cost model fitted to a real engine's own per-request timings (paper App. E.9, E.12).

Data: closed-population runs on the real engine whose turn rows carry the engine's timings of each
request (vLLM's --enable-per-request-metrics: queued -> scheduled, scheduled -> first token, first
-> last token). Nothing else enters the fit: no hit fraction, no throughput, no backlog; the runs
are made with the prefix cache off by default, so a request's computed tokens are its prompt.

Model (harness/config/cost.py, mixed iterations): one iteration costs
    tau = a + b * tokens + c_p * pairs + c_d * context / 8192
over the tokens it computes (prefill chunks and one per decoding request), the causal pairs of its
prefill chunks and the summed context of its decoders (f0, the floor of b * tokens, is set to 0:
the fit cannot see it). Every request gives two observations:
- its prefill: scheduled -> first token, the iterations that prefilled it (ceil(x / chunk) when it
  runs alone);
- its decode: first -> last token, exactly max_tokens - 1 iterations.
Each observation's duration is the sum of its iterations' costs, so it is linear in (a, b, c_p, c_d)
with features accumulated from the timeline: its own tokens, pairs and context, plus every other
request that overlapped it -- a decoding one adds one token (and its context) per iteration of the
overlap, a prefilling one the share of its prompt tokens and pairs that fell in the overlap. The
rows are weighted by 1/duration (relative errors) and solved by non-negative least squares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from harness.config.cost import CostModel
from harness.errors import RecordError
from harness.recording.record import load_run

PARAMS = ("a", "b", "c_p", "c_d")


class CostFitError(RecordError):
    """The runs cannot support a fit (no engine timings, too few requests)."""


@dataclass
class Timeline:
    """One run's completed requests on the engine's clock (seconds, plan time)."""

    sched: np.ndarray
    first: np.ndarray
    last: np.ndarray
    x: np.ndarray  # tokens computed in the prefill
    y: np.ndarray  # cached prefix
    d: np.ndarray  # output tokens
    ttft: np.ndarray
    decode: np.ndarray


def timeline(turns: pd.DataFrame) -> Timeline:
    """Place each request with engine timings on the engine's clock, anchored at its response.

    The last token is taken at the client's receipt of the response (the engine sends it right
    after the last token; the HTTP path adds a few ms), and the engine's own intervals are laid
    back from there."""
    need = ("engine_ttft", "engine_decode")
    if any(c not in turns.columns for c in need):
        raise CostFitError(
            "turn records carry no engine timings (columns engine_ttft, engine_decode): "
            "runs must come from an engine that reports them (vLLM with --enable-per-request-metrics)"
        )
    t = turns[(turns["status"] == "ok") & turns["engine_ttft"].notna() & turns["engine_decode"].notna()]
    t = t[t["completion_tokens"].fillna(0) >= 1]
    if t.empty:
        raise CostFitError("no completed request with engine timings")
    last = t["done_time"].to_numpy(float)
    dec = t["engine_decode"].to_numpy(float)
    ttft = t["engine_ttft"].to_numpy(float)
    first = last - dec
    sched = first - ttft
    cached = t["cached_tokens"].fillna(0).to_numpy(float)
    prompt = t["prompt_tokens"].to_numpy(float)
    return Timeline(sched, first, last, prompt - cached, cached, t["completion_tokens"].to_numpy(float), ttft, dec)


def _overlap(lo: np.ndarray, hi: np.ndarray, u: float, v: float) -> np.ndarray:
    out: np.ndarray = np.clip(np.minimum(hi, v) - np.maximum(lo, u), 0.0, None)
    return out


def design(tl: Timeline, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows [iterations, tokens, pairs, context/8192] per observation, the durations, and the row
    kind (0 prefill, 1 decode)."""
    n = tl.sched.size
    pairs = tl.x * (tl.y + (tl.x + 1.0) / 2.0)
    pre_len = np.maximum(tl.first - tl.sched, 1e-9)
    dec_len = np.maximum(tl.last - tl.first, 1e-9)
    rows: list[list[float]] = []
    obs: list[float] = []
    kind: list[int] = []
    for i in range(n):
        for phase in (0, 1):
            if phase == 0:
                u, v = tl.sched[i], tl.first[i]
                steps = max(1.0, math.ceil(tl.x[i] / chunk))
                tok, pr, ctx = tl.x[i], pairs[i], 0.0
                dur = tl.ttft[i]
            else:
                steps = tl.d[i] - 1.0
                if steps < 1:
                    continue
                u, v = tl.first[i], tl.last[i]
                tok = steps
                pr = 0.0
                ctx = steps * (tl.x[i] + tl.y[i] + 1.0 + tl.d[i] / 2.0)
                dur = tl.decode[i]
            if dur <= 0 or v <= u:
                continue
            span = v - u
            others = np.arange(n) != i
            # decoding neighbours: one token per iteration of the overlap, at their context then
            od = _overlap(tl.first, tl.last, u, v) * others
            dsteps = steps * od / span
            mid = np.clip((np.maximum(tl.first, u) + np.minimum(tl.last, v)) / 2.0, tl.first, tl.last)
            gen = tl.d * (mid - tl.first) / dec_len
            ctx_k = tl.x + tl.y + gen
            tok += float(np.sum(dsteps))
            ctx += float(np.sum(dsteps * ctx_k))
            # prefilling neighbours: the share of their prefill that fell in this interval
            op = _overlap(tl.sched, tl.first, u, v) * others
            share = op / pre_len
            tok += float(np.sum(share * tl.x))
            pr += float(np.sum(share * pairs))
            rows.append([steps, tok, pr, ctx / 8192.0])
            obs.append(dur)
            kind.append(phase)
    return np.asarray(rows), np.asarray(obs), np.asarray(kind)


@dataclass
class CostFit:
    params: dict[str, float]
    chunk: int
    rows: int
    runs: list[str]
    residuals: dict[str, Any] = field(default_factory=dict)
    per_row: pd.DataFrame | None = None

    def cost(self) -> CostModel:
        return CostModel(
            a=self.params["a"],
            f0=0.0,
            b=self.params["b"],
            c_p=self.params["c_p"],
            chunk=self.chunk,
            c_d=self.params["c_d"],
        )

    def cost_file(self, name: str, engine: str) -> dict[str, Any]:
        """The cost file (kind: cost), with a `fit` record: data, residuals."""
        return {
            "kind": "cost",
            "name": name,
            "description": (
                f"Iteration costs of {engine} fitted by `agentload calibrate costs` to the engine's own per-request "
                f"timings of {self.rows} observations in {len(self.runs)} closed run(s); no hit, throughput or backlog "
                f"entered the fit. Median |relative residual| {self.residuals['all']['median_abs_rel']:.3f}."
            ),
            "a": float(self.params["a"]),
            "f0": 0.0,
            "b": float(self.params["b"]),
            "c_p": float(self.params["c_p"]),
            "chunk": int(self.chunk),
            "c_d": float(self.params["c_d"]),
            "speed": 1.0,
            "token_factor": 1.0,
            "fit": {"runs": self.runs, "observations": self.rows, "residuals": self.residuals},
        }


def _stats(rel: np.ndarray) -> dict[str, float]:
    a = np.abs(rel)
    return {
        "n": int(rel.size),
        "median_rel": float(np.median(rel)) if rel.size else math.nan,
        "median_abs_rel": float(np.median(a)) if rel.size else math.nan,
        "p90_abs_rel": float(np.quantile(a, 0.9)) if rel.size else math.nan,
        "rms_rel": float(np.sqrt(np.mean(rel**2))) if rel.size else math.nan,
    }


def fit_costs(
    turn_tables: Sequence[pd.DataFrame], chunk: int, *, names: Sequence[str] = (), min_rows: int = 20
) -> CostFit:
    """Fit (a, b, c_p, c_d) to the per-request timings of the given runs (one turn table each)."""
    X, y, k = [], [], []
    for t in turn_tables:
        rows, obs, kind = design(timeline(t), chunk)
        if rows.size:
            X.append(rows)
            y.append(obs)
            k.append(kind)
    if not X:
        raise CostFitError("no usable observation in the runs")
    A = np.vstack(X)
    b = np.concatenate(y)
    kinds = np.concatenate(k)
    if len(b) < min_rows:
        raise CostFitError(f"{len(b)} observations; at least {min_rows} are needed for a fit")
    w = 1.0 / b
    scale = np.maximum(np.abs(A * w[:, None]).max(axis=0), 1e-300)  # condition the columns
    sol, _ = nnls((A * w[:, None]) / scale, b * w)
    theta = sol / scale
    pred = A @ theta
    rel = (pred - b) / b
    res = {"all": _stats(rel), "prefill": _stats(rel[kinds == 0]), "decode": _stats(rel[kinds == 1])}
    per_row = pd.DataFrame(
        {"kind": np.where(kinds == 0, "prefill", "decode"), "observed": b, "predicted": pred, "rel": rel}
    )
    return CostFit(dict(zip(PARAMS, map(float, theta))), chunk, len(b), list(names), res, per_row)


def fit_from_runs(run_dirs: Sequence[Path | str], chunk: int) -> CostFit:
    tables = [load_run(d).turns for d in run_dirs]
    return fit_costs(tables, chunk, names=[str(d) for d in run_dirs])
