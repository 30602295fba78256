"""The iteration-cost model fitted to a real engine's own per-request timings (paper App. E.9, E.12).

Data: closed-population runs on the real engine whose turn rows carry the engine's timings of each
request (vLLM's --enable-per-request-metrics: queued -> scheduled, scheduled -> first token, first
-> last token). No hit fraction, throughput or backlog enters this part of the fit (the summaries
can be fitted with it: sim2real/summaryfit.py).

Model (harness/config/cost.py, mixed iterations): one iteration costs
    tau = a + b * tokens + c_p * pairs + c_d * context / 8192 + c_r * requests
over the tokens it computes (prefill chunks and one per decoding request), the causal pairs of its
prefill chunks, the summed context of its decoders and the requests it admits for the first time
(f0, the floor of b * tokens, is set to 0: the fit cannot see it). Why each term: a is the step's
fixed work (the scheduler, the forward pass's launch, sampling: on the CPU engine most of a small
step); b the per-token work of the layers; c_p attention over the prompt, cached prefix included,
which is what a cached turn's prefill pays for its prefix; c_d attention over a decoder's context;
c_r what a request costs outside the steps (the front end taking it in and answering it), which a
quota'd CPU engine pays from the same CPU budget. Every request gives two observations:
- its prefill: scheduled -> first token, the iterations that prefilled it (ceil(x / chunk) when it
  runs alone) and its own admission;
- its decode: first -> last token, exactly max_tokens - 1 iterations.
Each observation's duration is the sum of its iterations' costs, so it is linear in the parameters,
with features accumulated from the timeline: its own tokens, pairs and context, plus every other
request that overlapped it -- a decoding one adds one token (and its context) per iteration of the
overlap, a prefilling one the share of its prompt tokens, pairs and admission that fell in the
overlap (with separate prefill and decode batches, SGLang's, the share of its prefill iterations
too). The rows are solved by non-negative least squares on relative errors, weighted by the
*predicted* duration and iterated (IRLS): weighting by the observed duration, as this fit first did,
favours the rows that happened to be short, and on a CPU engine under a quota, whose steps run
either unthrottled (a few ms) or across a throttled period (~80 ms), that fitted the unthrottled
speed and set a = 0.
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
from sim2real.quota import quota_scales, run_quota

PARAMS = ("a", "b", "c_p", "c_d", "c_r")


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


def server_gap(turns: pd.DataFrame) -> float:
    """The median of client latency - (queue + engine ttft + engine decode) over a run's completed
    requests with engine timings: the time a request spends in the server outside the engine's own
    intervals (the front end in and out; part of it, the wait for the running step to end, the engine
    model has too)."""
    t = turns[(turns["status"] == "ok") & turns["engine_ttft"].notna() & turns["engine_decode"].notna()]
    gap = (t["done_time"] - t["send_time"]) - (t["queue_time"].fillna(0) + t["engine_ttft"] + t["engine_decode"])
    return float(gap.median()) if len(gap) else math.nan


def _overlap(lo: np.ndarray, hi: np.ndarray, u: float, v: float) -> np.ndarray:
    out: np.ndarray = np.clip(np.minimum(hi, v) - np.maximum(lo, u), 0.0, None)
    return out


def design(tl: Timeline, chunk: int, separate: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows [iterations, tokens, pairs, context/8192, admissions] per observation, the durations, and
    the row kind (0 prefill, 1 decode). `separate`: prefill and decode run in separate iterations
    (SGLang's default), so a neighbour's prefill inside a decode interval adds its own iterations."""
    n = tl.sched.size
    pairs = tl.x * (tl.y + (tl.x + 1.0) / 2.0)
    pre_len = np.maximum(tl.first - tl.sched, 1e-9)
    pre_steps = np.maximum(1.0, np.ceil(tl.x / chunk))
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
                adm = 1.0  # its own admission is charged in its first prefill iteration
                dur = tl.ttft[i]
            else:
                steps = tl.d[i] - 1.0
                if steps < 1:
                    continue
                u, v = tl.first[i], tl.last[i]
                tok = steps
                pr = 0.0
                adm = 0.0
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
            adm += float(np.sum(share))
            n_it = steps + (float(np.sum(share * pre_steps)) if separate and phase == 1 else 0.0)
            rows.append([n_it, tok, pr, ctx / 8192.0, adm])
            obs.append(dur)
            kind.append(phase)
    return np.asarray(rows), np.asarray(obs), np.asarray(kind)


@dataclass
class TimingRows:
    """The observations of a set of runs: design rows (PARAMS' columns), durations, kinds (0 prefill,
    1 decode) and the runs they came from."""

    A: np.ndarray
    y: np.ndarray
    kinds: np.ndarray
    runs: list[str]
    # per run, the median time a request spent in the server outside the engine's own intervals:
    # client latency - (queue + engine ttft + engine decode); where d_r starts in a joint fit
    gaps: list[float] = field(default_factory=list)
    # quota-scaled rows (sim2real/quota.py): the quota the parameters hold at, and each run's quota
    cpu_quota: float | None = None
    run_quotas: list[float] = field(default_factory=list)

    def quota_record(self) -> dict[str, Any] | None:
        """What a cost file records of the quota scaling (None: the rows are not scaled)."""
        if self.cpu_quota is None:
            return None
        return {"cpu_quota": self.cpu_quota, "runs": dict(zip(self.runs, self.run_quotas, strict=True))}

    def __len__(self) -> int:
        return int(self.y.size)

    def rel(self, theta: np.ndarray) -> np.ndarray:
        """Relative residuals (predicted - observed) / observed of the parameters `theta`."""
        out: np.ndarray = (self.A @ theta - self.y) / self.y
        return out

    def residuals(self, theta: np.ndarray) -> dict[str, Any]:
        rel = self.rel(theta)
        return {"all": _stats(rel), "prefill": _stats(rel[self.kinds == 0]), "decode": _stats(rel[self.kinds == 1])}

    def per_row(self, theta: np.ndarray) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "kind": np.where(self.kinds == 0, "prefill", "decode"),
                "observed": self.y,
                "predicted": self.A @ theta,
                "rel": self.rel(theta),
            }
        )


@dataclass
class CostFit:
    params: dict[str, float]
    chunk: int
    rows: int
    runs: list[str]
    residuals: dict[str, Any] = field(default_factory=dict)
    per_row: pd.DataFrame | None = None
    quota: dict[str, Any] | None = None  # TimingRows.quota_record() of a quota-scaled fit

    def cost(self) -> CostModel:
        return CostModel(
            a=self.params["a"],
            f0=0.0,
            b=self.params["b"],
            c_p=self.params["c_p"],
            chunk=self.chunk,
            c_d=self.params["c_d"],
            c_r=self.params.get("c_r", 0.0),
        )

    def cost_file(self, name: str, engine: str) -> dict[str, Any]:
        """The cost file (kind: cost), with a `fit` record: data, residuals."""
        quota = self.quota.get("cpu_quota") if self.quota else None
        fit: dict[str, Any] = {"runs": self.runs, "observations": self.rows, "residuals": self.residuals}
        if self.quota:
            fit["quota_scaling"] = self.quota
        return {
            "kind": "cost",
            "name": name,
            "description": (
                f"Iteration costs of {engine} fitted by `agentload calibrate costs` to the engine's own per-request "
                f"timings of {self.rows} observations in {len(self.runs)} closed run(s); no hit, throughput or backlog "
                f"entered the fit. Median |relative residual| {self.residuals['all']['median_abs_rel']:.3f}."
            ),
            **cost_params(self.params, self.chunk, quota),
            "fit": fit,
        }


def cost_params(params: dict[str, float], chunk: int, cpu_quota: float | None = None) -> dict[str, Any]:
    """A cost file's parameters in its documented order (c_r, d_r written only when the fit set them;
    cpu_quota only for a quota-scaled fit)."""
    out: dict[str, Any] = {
        "a": float(params["a"]),
        "f0": float(params.get("f0", 0.0)),
        "b": float(params["b"]),
        "c_p": float(params["c_p"]),
        "chunk": int(chunk),
        "c_d": float(params["c_d"]),
        "speed": 1.0,
        "token_factor": 1.0,
    }
    for key in ("c_r", "d_r"):  # written only when the fit set them
        if params.get(key, 0.0) > 0:
            out[key] = float(params[key])
    if cpu_quota is not None:
        out["cpu_quota"] = float(cpu_quota)
    return out


def _stats(rel: np.ndarray) -> dict[str, float]:
    a = np.abs(rel)
    return {
        "n": int(rel.size),
        "median_rel": float(np.median(rel)) if rel.size else math.nan,
        "median_abs_rel": float(np.median(a)) if rel.size else math.nan,
        "p90_abs_rel": float(np.quantile(a, 0.9)) if rel.size else math.nan,
        "rms_rel": float(np.sqrt(np.mean(rel**2))) if rel.size else math.nan,
    }


def timing_rows(
    turn_tables: Sequence[pd.DataFrame],
    chunk: int,
    *,
    names: Sequence[str] = (),
    separate: bool = False,
    min_rows: int = 20,
    quotas: Sequence[float | None] | None = None,
) -> TimingRows:
    """The observations of the given runs (one turn table each); refused when too few.

    `quotas` (one per run: the CPU quota it ran under) scales the rows to their mean quota: a run at
    quota q took q_ref / q times what it would at q_ref, so its rows' features are multiplied by that
    (the parameters then hold at q_ref, sim2real/quota.py)."""
    ref: float | None = None
    factors: list[float] = [1.0] * len(turn_tables)
    if quotas is not None:
        try:
            ref, factors = quota_scales(
                list(quotas), [str(n) for n in names] or [f"run {i}" for i in range(len(quotas))]
            )
        except ValueError as exc:
            raise CostFitError(str(exc)) from None
    X, y, k, gaps = [], [], [], []
    for t, f in zip(turn_tables, factors, strict=True):
        rows, obs, kind = design(timeline(t), chunk, separate)
        if rows.size:
            X.append(rows / f)
            y.append(obs)
            k.append(kind)
            gaps.append(server_gap(t))
    if not X:
        raise CostFitError("no usable observation in the runs")
    tr = TimingRows(np.vstack(X), np.concatenate(y), np.concatenate(k), list(names), gaps)
    if ref is not None and quotas is not None:
        tr.cpu_quota = ref
        tr.run_quotas = [float(q) for q in quotas if q is not None]  # as read (quota_scales refused a missing one)
    if len(tr) < min_rows:
        raise CostFitError(f"{len(tr)} observations; at least {min_rows} are needed for a fit")
    return tr


def solve_rows(tr: TimingRows, *, free: Sequence[str] = PARAMS, iterations: int = 8) -> np.ndarray:
    """Non-negative least squares on relative errors, reweighted by the predicted durations (IRLS);
    parameters not in `free` are held at 0. Returns theta in PARAMS' order."""
    cols = [PARAMS.index(p) for p in free]
    A = tr.A[:, cols]
    b = tr.y
    w = np.ones_like(b) / float(np.median(b))  # first pass: absolute errors (unbiased, if noisier)
    sol = np.zeros(len(cols))
    for _ in range(iterations):
        Aw = A * w[:, None]
        scale = np.maximum(np.abs(Aw).max(axis=0), 1e-300)  # condition the columns
        x, _ = nnls(Aw / scale, b * w)
        sol = x / scale
        pred = A @ sol
        w = 1.0 / np.maximum(pred, 0.05 * b)  # a row predicted near 0 must not take all the weight
    theta = np.zeros(len(PARAMS))
    theta[cols] = sol
    return theta


def fit_costs(
    turn_tables: Sequence[pd.DataFrame],
    chunk: int,
    *,
    names: Sequence[str] = (),
    min_rows: int = 20,
    separate: bool = False,
    free: Sequence[str] = PARAMS,
    quotas: Sequence[float | None] | None = None,
) -> CostFit:
    """Fit the PARAMS in `free` to the per-request timings of the given runs (one turn table each);
    with `quotas`, scaled to their mean quota (timing_rows)."""
    tr = timing_rows(turn_tables, chunk, names=names, separate=separate, min_rows=min_rows, quotas=quotas)
    theta = solve_rows(tr, free=free)
    return CostFit(
        dict(zip(PARAMS, map(float, theta))),
        chunk,
        len(tr),
        list(names),
        tr.residuals(theta),
        tr.per_row(theta),
        tr.quota_record(),
    )


def _load(run_dirs: Sequence[Path | str], quota_scaled: bool) -> tuple[list[pd.DataFrame], list[float | None] | None]:
    runs = [load_run(d) for d in run_dirs]
    return [r.turns for r in runs], ([run_quota(r.meta) for r in runs] if quota_scaled else None)


def fit_from_runs(
    run_dirs: Sequence[Path | str],
    chunk: int,
    *,
    separate: bool = False,
    free: Sequence[str] = PARAMS,
    quota_scaled: bool = False,
) -> CostFit:
    tables, quotas = _load(run_dirs, quota_scaled)
    return fit_costs(tables, chunk, names=[str(d) for d in run_dirs], separate=separate, free=free, quotas=quotas)


def rows_from_runs(
    run_dirs: Sequence[Path | str], chunk: int, *, separate: bool = False, quota_scaled: bool = False
) -> TimingRows:
    tables, quotas = _load(run_dirs, quota_scaled)
    return timing_rows(tables, chunk, names=[str(d) for d in run_dirs], separate=separate, quotas=quotas)
