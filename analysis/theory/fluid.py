"""Model F as a trajectory: the exact FIFO re-entrant fluid (App. A, Lemma 3).

Two solvers, one law:

* `ExactFluid` solves model F with continuous mass (arrival rate lambda(t), piecewise constant) from
  an initial pending mass, exactly. FIFO at unit work rate gives f(u) = V0 + W(u) (Lemma 3(ii)):
  a request that joins at u completes at f(u). Join rates stay piecewise constant in u, because
  the mass that joined on [s, e) completes uniformly on [f(s), f(e)) and rejoins there, so f is
  piecewise linear and the solution is built one generation [b_n, b_{n+1}) at a time with no
  discretization. Its limits, busy periods and the orbit recursion of Lemma 1 can then be checked
  to floating-point accuracy rather than to a step size.

* `plan_fluid` drives model F with a seed's exact frozen plan: each session is an atom of mass one
  with its own turn count, so the FIFO fluid becomes a deterministic single-server queue with
  re-entry. This is what per-seed predictions (CUT slopes, MIRROR waves) need: the plan's actual
  arrivals and turn counts, not their law.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from analysis.arrays import FloatArray
from analysis.theory.model_f import ModelF


# ---------------------------------------------------------------------------------------------
# exact continuous fluid
# ---------------------------------------------------------------------------------------------
@dataclass
class ExactFluid:
    """Exact model-F fluid from initial pending masses, with piecewise-constant arrivals.

    model         costs and turn law
    rates         [(t_i, lambda_i), ...]: class-1 arrival rate lambda_i on [t_i, t_{i+1}), t_0 = 0
    initial       pending masses at time 0 in service order: a sequence of K-vectors, each served
                  as one uniformly mixed block (e.g. [m0] for one block); total work must be > 0
    """

    model: ModelF
    rates: Sequence[tuple[float, float]]
    initial: Sequence[np.ndarray]
    emptied_at: float | None = field(init=False, default=None)
    generations: list[float] = field(init=False)  # b_0 = 0, b_1 = V0, b_{n+1} = f(b_n)

    def __post_init__(self) -> None:
        K = self.model.K
        blocks = [np.asarray(m, float) for m in self.initial]
        if not blocks or any(b.shape != (K,) or np.any(b < 0) for b in blocks):
            raise ValueError("initial must be a non-empty sequence of non-negative K-vectors")
        work = [float(np.dot(self.model.c, b)) for b in blocks]
        if sum(work) <= 0:
            raise ValueError("model F needs positive initial work (F6)")
        rt = sorted((float(t), float(l)) for t, l in self.rates)
        if not rt or rt[0][0] != 0.0 or any(l < 0 for _, l in rt):
            raise ValueError("rates must start at t = 0 with non-negative values")
        self._rt = np.array([t for t, _ in rt]), np.array([l for _, l in rt])
        n = len(blocks)
        xs = np.arange(-n, 1, dtype=float)
        fbs = np.concatenate(([0.0], np.cumsum(work)))
        # one chunk per generation: (breakpoints, f at breakpoints, join rates); consolidated lazily
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [(xs, fbs, np.array(blocks))]
        self._dirty = True
        self.generations = [0.0, float(fbs[-1])]

    def _consolidate(self) -> None:
        if not self._dirty:
            return
        ch = self._chunks
        self._s = np.concatenate([ch[0][0]] + [c[0][1:] for c in ch[1:]])
        self._fb = np.concatenate([ch[0][1]] + [c[1][1:] for c in ch[1:]])
        self._J = np.vstack([c[2] for c in ch])
        inc = self._J * np.diff(self._s)[:, None]
        self._cj = np.vstack((np.zeros(self.model.K), np.cumsum(inc, axis=0)))
        self._dirty = False

    @property
    def s(self) -> FloatArray:
        """Breakpoints on the join axis (initial blocks on the virtual interval [-n, 0))."""
        self._consolidate()
        return self._s

    @property
    def fb(self) -> FloatArray:
        """Completion time f at each breakpoint."""
        self._consolidate()
        return self._fb

    @property
    def J(self) -> FloatArray:
        """Join rate per class on each segment."""
        self._consolidate()
        return self._J

    # -- construction ------------------------------------------------------------------------
    def _lambda_at(self, t: np.ndarray) -> np.ndarray:
        times, lams = self._rt
        return lams[np.searchsorted(times, t, side="right") - 1]

    def _step(self) -> bool:
        """Extend joins from the frontier F to f(F). Returns False once the queue has emptied."""
        c, r = self.model.c, self.model.r
        px, pf, pJ = self._chunks[-1]  # parents: the last generation, covering [f^-1(F), F)
        F, fF = px[-1], pf[-1]
        images = pf
        times, _ = self._rt
        extra = times[(times > F) & (times < fF)]
        x = np.unique(np.concatenate((images, extra)))
        mids = 0.5 * (x[:-1] + x[1:])
        p = np.clip(np.searchsorted(images, mids, side="right") - 1, 0, px.size - 2)
        width = px[p + 1] - px[p]
        img = pf[p + 1] - pf[p]
        rejoin = np.zeros((p.size, self.model.K))
        scale = np.divide(width, img, out=np.zeros_like(img), where=img > 0)
        rejoin[:, 1:] = (pJ[p] * r)[:, :-1] * scale[:, None]
        rejoin[:, 0] += self._lambda_at(mids)
        w = rejoin @ c
        dx = np.diff(x)
        fnew = fF + np.concatenate(([0.0], np.cumsum(w * dx)))
        # busy check: f(u) > u throughout; f - u is linear on each piece
        slack = fnew - x
        bad = np.nonzero(slack[1:] <= 0.0)[0]
        if bad.size:
            j = int(bad[0])
            u_star = x[j] + slack[j] / (1.0 - w[j])
            x = np.append(x[: j + 1], u_star)
            fnew = np.append(fnew[: j + 1], u_star)
            rejoin = rejoin[: j + 1]
            self.emptied_at = float(u_star)
        self._chunks.append((x, fnew, rejoin))
        self._dirty = True
        if self.emptied_at is None:
            self.generations.append(float(fnew[-1]))
            return True
        return False

    def run(self, t_end: float, *, min_cycle: float = 0.0, max_generations: int = 1_000_000) -> ExactFluid:
        """Build the solution until the frontier passes t_end, the queue empties, or the cycle
        V(b_n) falls below min_cycle (useful for rho < 1, where b_n only converges to the empty time).
        """
        for _ in range(max_generations):
            if self.emptied_at is not None or self.frontier >= t_end:
                break
            if len(self.generations) >= 2 and self.generations[-1] - self.generations[-2] < min_cycle:
                break
            self._step()
        return self

    @property
    def frontier(self) -> float:
        """Joins, completions and the state are known on [0, frontier)."""
        return float(self._chunks[-1][0][-1])

    # -- queries --------------------------------------------------------------------------------
    @property
    def _cum(self) -> FloatArray:
        self._consolidate()
        return self._cj

    def _interp_rows(self, x: np.ndarray | float, xp: FloatArray, rows: FloatArray) -> FloatArray:
        xs = np.atleast_1d(np.asarray(x, dtype=np.float64))
        i = np.clip(np.searchsorted(xp, xs, side="right") - 1, 0, xp.size - 2)
        t = (xs - xp[i]) / (xp[i + 1] - xp[i])
        return rows[i] + t[:, None] * (rows[i + 1] - rows[i])

    # The scalar-or-array queries: a time in gives a number out, an array of times an array.
    @overload
    def f(self, u: float) -> float: ...
    @overload
    def f(self, u: np.ndarray) -> FloatArray: ...
    def f(self, u: np.ndarray | float) -> FloatArray | float:
        """Completion time of a request that joins at u."""
        self._consolidate()
        return np.interp(np.asarray(u, dtype=np.float64), self.s, self.fb)

    @overload
    def f_inv(self, t: float) -> float: ...
    @overload
    def f_inv(self, t: np.ndarray) -> FloatArray: ...
    def f_inv(self, t: np.ndarray | float) -> FloatArray | float:
        """Join time of the request that completes at t."""
        self._consolidate()
        return np.interp(np.asarray(t, dtype=np.float64), self.fb, self.s)

    def joined(self, u: np.ndarray | float) -> FloatArray:
        """Cumulative class masses joined by u (initial masses counted on the virtual axis)."""
        cum = self._cum
        return self._interp_rows(u, self.s, cum)

    def completed(self, t: np.ndarray | float) -> FloatArray:
        """Cumulative class completions by t (FIFO: C_k(f(u)) = m0_k + J_k(u))."""
        return self.joined(self.f_inv(t))

    def pending(self, t: np.ndarray | float) -> FloatArray:
        """Pending class masses pi_k(t) (one pending request per present session, zero think time)."""
        return self.joined(t) - self.completed(t)

    @overload
    def V(self, t: float) -> float: ...
    @overload
    def V(self, t: np.ndarray) -> FloatArray: ...
    def V(self, t: np.ndarray | float) -> FloatArray | float:
        """Pending work = gap a request joining at t waits until it completes."""
        return self.f(t) - np.asarray(t, dtype=np.float64)

    @overload
    def N(self, t: float) -> float: ...
    @overload
    def N(self, t: np.ndarray) -> FloatArray: ...
    def N(self, t: np.ndarray | float) -> FloatArray | float:
        """Sessions present (pending requests)."""
        return _like(t, self.pending(t).sum(axis=1))

    @overload
    def V_tot(self, t: float) -> float: ...
    @overload
    def V_tot(self, t: np.ndarray) -> FloatArray: ...
    def V_tot(self, t: np.ndarray | float) -> FloatArray | float:
        """Remaining all-miss work of the sessions present, future turns included."""
        return _like(t, self.pending(t) @ self.model.remaining_work)

    @overload
    def departures(self, t: float) -> float: ...
    @overload
    def departures(self, t: np.ndarray) -> FloatArray: ...
    def departures(self, t: np.ndarray | float) -> FloatArray | float:
        """Cumulative sessions finished by t: a class-k completion ends its session w.p. 1 - r_k."""
        return _like(t, self.completed(t) @ (1.0 - self.model.r))

    @overload
    def gap(self, t: float) -> float: ...
    @overload
    def gap(self, t: np.ndarray) -> FloatArray: ...
    def gap(self, t: np.ndarray | float) -> FloatArray | float:
        """Gap between a session's consecutive completions, for a turn that completes at t."""
        ts = np.asarray(t, dtype=np.float64)
        return ts - self.f_inv(ts)

    def served_prompt(self, t1: float, t2: float) -> float:
        """Mean prompt of the turns completed in [t1, t2) (the composition statistic)."""
        dc = (self.completed(t2) - self.completed(t1))[0]
        return float(np.dot(dc, self.model.L) / dc.sum())

    def trajectory(self, t: np.ndarray) -> dict[str, FloatArray]:
        t = np.asarray(t, float)
        return {
            "t": t,
            "backlog": self.N(t),
            "V": self.V(t),
            "V_tot": self.V_tot(t),
            "departures": self.departures(t),
        }

    # -- Lemma 1 ---------------------------------------------------------------------------------
    def orbit(self, u0: float, n: int) -> np.ndarray:
        """u_0, u_1 = f(u_0), ..., as far as the solution is known (at most n + 1 points)."""
        out = [float(u0)]
        for _ in range(n):
            nxt = float(self.f(out[-1]))
            if nxt >= self.frontier:
                break
            out.append(nxt)
        return np.array(out)

    def lemma1_residual(self, u0: float, n: int, lam: float) -> dict[str, Any]:
        """Check Delta_n = sum_{k<=min(n,K)} a_k Delta_{n-k} + h_n along the orbit from u0.

        Needs a constant arrival rate lam from u0 on. Returns the residuals (absolute, and relative
        to Delta_n), h_n and the check sum_n h_n = V_tot(u0).
        """
        mf = self.model
        u = self.orbit(u0, n + 1)
        D = np.diff(u)
        K = mf.K
        pi0 = self.pending(u0)[0]
        a = lam * mf.c * mf.G
        h = np.zeros(K)
        for m in range(K):  # h_m = sum_{k=m+1}^{K} c_k G_k/G_{k-m} pi_{k-m}(u0)
            kk = np.arange(m + 1, K + 1)
            h[m] = float(np.sum(mf.c[kk - 1] * mf.G[kk - 1] / mf.G[kk - m - 1] * pi0[kk - m - 1]))
        res = np.empty(D.size)
        for m in range(D.size):
            kk = np.arange(1, min(m, K) + 1)
            pred = float(np.dot(a[kk - 1], D[m - kk])) + (h[m] if m < K else 0.0)
            res[m] = D[m] - pred
        return {
            "u": u,
            "Delta": D,
            "h": h,
            "residual": res,
            "max_rel_residual": float(np.max(np.abs(res) / D)) if D.size else math.nan,
            "h_sum": float(h.sum()),
            "V_tot_u0": float(self.V_tot(u0)),
        }

    def late_slopes(self, t1: float, t2: float, n: int = 200) -> dict[str, float]:
        """Least-squares slopes over [t1, t2] of V (gap slope), N (backlog growth), departures, and
        the mean served prompt of the window: the statistics Theorem 1(a) predicts."""
        t = np.linspace(t1, t2, n)
        tr = self.trajectory(t)
        return {
            "gap_slope": float(np.polyfit(t, tr["V"], 1)[0]),
            "gap_slope_completion": float(np.polyfit(t, self.gap(t), 1)[0]),
            "backlog_slope": float(np.polyfit(t, tr["backlog"], 1)[0]),
            "completion_rate": float(np.polyfit(t, tr["departures"], 1)[0]),
            "served_prompt": self.served_prompt(t1, t2),
            "pending_prompt": float(np.dot(self.pending(t2)[0], self.model.L) / self.pending(t2)[0].sum()),
        }


def _like(t: np.ndarray | float, values: FloatArray) -> FloatArray | float:
    """Scalar in, scalar out."""
    return float(values[0]) if np.ndim(t) == 0 else values


def burst_state(model: ModelF, size: float) -> list[np.ndarray]:
    """Initial pending mass of `size` fresh sessions (all at turn 1)."""
    m = np.zeros(model.K)
    m[0] = size
    return [m]


def good_state_initial(model: ModelF, lam: float, tool_mean: float) -> np.ndarray:
    """Pending mass when a trap starts out of the good state at rate lam: the sessions in tool calls.

    In the good state a turn's service is short against the tool time, so by Little's law
    lam G_k zbar sessions are in the tool call before their turn k (k >= 2); when every turn starts
    to miss they join model F's queue at those turns. Used as the initial block of a trajectory
    that starts at a burst (the burst itself enters as an arrival-rate bump or a second block).
    """
    m = lam * tool_mean * model.G.copy()
    m[0] = 0.0
    return m


def time_to_backlog(fl: ExactFluid, level: float, t_from: float) -> float:
    """First time >= t_from at which the fluid backlog falls to `level` (nan if not reached)."""
    t = np.linspace(t_from, fl.frontier, 20001)
    N = fl.N(t)
    idx = np.nonzero(level >= N)[0]
    if idx.size == 0:
        return math.nan
    i = int(idx[0])
    if i == 0:
        return float(t[0])
    return float(np.interp(level, [N[i], N[i - 1]], [t[i], t[i - 1]]))


# ---------------------------------------------------------------------------------------------
# plan-driven model F (atoms)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanFluidResult:
    """Requests served by the plan-driven model F and the sessions' life times."""

    requests: dict[str, np.ndarray]  # session, turn, join, done, prompt
    sessions: dict[str, np.ndarray]  # arrival, n_turns, burst, start, end (inf if unfinished)
    t_start: float
    t_end: float

    def trajectory(self, bin_width: float = 60.0) -> dict[str, np.ndarray]:
        """Per-bin series: backlog (bin-mean sessions present), completions, served prompt, gap."""
        edges = np.arange(0.0, self.t_end + bin_width, bin_width)
        edges = edges[edges <= self.t_end + 1e-9]
        lo, hi = edges[:-1], edges[1:]
        arr, end = self.sessions["arrival"], self.sessions["end"]
        # bin-mean backlog: overlap of [arrival, end) with each bin, divided by the width
        a = np.clip(arr[None, :], lo[:, None], hi[:, None])
        b = np.clip(end[None, :], lo[:, None], hi[:, None])
        backlog = np.sum(np.maximum(b - a, 0.0), axis=1) / (hi - lo)
        done_s = np.histogram(end[np.isfinite(end)], bins=edges)[0]
        req = self.requests
        t_done, prompt = req["done"], req["prompt"]
        cnt = np.histogram(t_done, bins=edges)[0]
        psum = np.histogram(t_done, bins=edges, weights=prompt)[0]
        follow = (req["turn"] > 1) & np.isfinite(req["gap"])
        gsum = np.histogram(t_done[follow], bins=edges, weights=req["gap"][follow])[0]
        gcnt = np.histogram(t_done[follow], bins=edges)[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "t_lo": lo,
                "t_hi": hi,
                "backlog": backlog,
                "completions": done_s.astype(float),
                "completion_rate": done_s / (hi - lo),
                "turns_served": cnt.astype(float),
                "served_prompt": np.where(cnt > 0, psum / cnt, np.nan),
                "gap": np.where(gcnt > 0, gsum / gcnt, np.nan),
            }

    def burst_median_completion(self) -> float:
        """Median end time of the burst cohort (the MIRROR 'wave'); nan if half are unfinished."""
        end = self.sessions["end"][self.sessions["burst"]]
        if end.size == 0:
            return math.nan
        med = float(np.median(end))
        return med if math.isfinite(med) else math.nan

    def completion_rate(self, t1: float, t2: float) -> float:
        end = self.sessions["end"]
        return float(np.sum((end >= t1) & (end < t2))) / (t2 - t1)

    def backlog_slope(self, t1: float, t2: float, bin_width: float = 10.0) -> float:
        tr = self.trajectory(bin_width)
        m = (tr["t_lo"] >= t1) & (tr["t_hi"] <= t2)
        x = 0.5 * (tr["t_lo"][m] + tr["t_hi"][m])
        return float(np.polyfit(x, tr["backlog"][m], 1)[0])


def plan_fluid(
    model: ModelF,
    arrivals: np.ndarray,
    n_turns: np.ndarray,
    burst: np.ndarray | None = None,
    *,
    t_end: float,
    t_start: float | None = None,
    think: Sequence[Sequence[float]] | None = None,
    pre_start_tools: Sequence[Sequence[float]] | None = None,
    cut: tuple[float, float] | None = None,
) -> PlanFluidResult:
    """Model F driven by an exact plan: FIFO single server at unit rate, every turn missing.

    t_start   when the trap starts (default: the first burst arrival, else 0). Before it the engine
              is taken to be in the good state: a session's turns take no time beyond its tool
              calls (pre_start_tools, the plan's tool times; without them sessions that arrived
              before t_start are dropped). Sessions alive at t_start join the queue then, in arrival
              order, at their next turn.
    think     per-session think times after turns 1..T-1 inside the trap (default zero, as in
              model F's (F4)); the paper finds a 5 s think time changes window statistics < 0.02%.
    cut       (time, keep_fraction): a deterministic thinning of arrivals after `time`, keeping a
              fraction by arrival index; a frozen CUT plan already carries its own thinning.
    """
    arrivals = np.asarray(arrivals, float)
    n_turns = np.asarray(n_turns, int)
    burst = np.zeros(arrivals.size, bool) if burst is None else np.asarray(burst, bool)
    if not (arrivals.size == n_turns.size == burst.size):
        raise ValueError("arrivals, n_turns and burst must have equal length")
    if np.any(n_turns < 1) or np.any(n_turns > model.K):
        raise ValueError(f"turn counts must lie in 1..{model.K}")
    keep = np.ones(arrivals.size, bool)
    if cut is not None:
        t_cut, frac = cut
        after = np.nonzero((arrivals >= t_cut) & ~burst)[0]
        # keep every arrival whose running count crosses an integer multiple of 1/frac
        acc = np.floor((np.arange(after.size) + 1) * frac) - np.floor(np.arange(after.size) * frac)
        keep[after] = acc > 0
    order = np.argsort(arrivals, kind="stable")
    order = order[keep[order]]
    if t_start is None:
        t_start = float(arrivals[burst].min()) if burst.any() else 0.0
    c = model.c
    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    start_turn = np.ones(arrivals.size, int)
    first_join = arrivals.copy()
    end = np.full(arrivals.size, math.inf)
    for i in order:
        a = arrivals[i]
        if a < t_start:
            if pre_start_tools is None:
                end[i] = a  # dropped: not part of the trapped system
                continue
            tools = np.asarray(pre_start_tools[i], float)
            starts = a + np.concatenate(([0.0], np.cumsum(tools)))[: n_turns[i]]
            nxt = np.nonzero(starts >= t_start)[0]
            if nxt.size == 0:
                end[i] = starts[-1]
                continue
            k = int(nxt[0])  # turns before index k were served in the good state
            start_turn[i] = k + 1
            first_join[i] = t_start
        heapq.heappush(heap, (float(first_join[i]), seq, int(i), int(start_turn[i])))
        seq += 1
    free = t_start
    rs, rk, rj, rd, rg = [], [], [], [], []
    last_done = np.full(arrivals.size, math.nan)
    while heap:
        join, _, i, k = heapq.heappop(heap)
        st = max(free, join)
        if st >= t_end:
            break
        done = st + c[k - 1]
        free = done
        rs.append(i)
        rk.append(k)
        rj.append(join)
        rd.append(done)
        rg.append(done - last_done[i] if k > 1 and not math.isnan(last_done[i]) else math.nan)
        last_done[i] = done
        if k < n_turns[i]:
            nxt = done + (float(think[i][k - 1]) if think is not None else 0.0)
            heapq.heappush(heap, (nxt, seq, i, k + 1))
            seq += 1
        else:
            end[i] = done
    rs_a = np.array(rs, int)
    rk_a = np.array(rk, int)
    requests = {
        "session": rs_a,
        "turn": rk_a,
        "join": np.array(rj, float),
        "done": np.array(rd, float),
        "prompt": model.L[rk_a - 1] if rk_a.size else np.array([], float),
        "gap": np.array(rg, float),
    }
    sel = order  # sessions that exist in this arm (thinned ones removed)
    sessions = {
        "arrival": arrivals[sel],
        "n_turns": n_turns[sel],
        "burst": burst[sel],
        "end": end[sel],
        "index": sel,
    }
    return PlanFluidResult(requests=requests, sessions=sessions, t_start=float(t_start), t_end=float(t_end))


def plan_fluid_from_plan(model: ModelF, plan: Any, *, t_end: float, **kw: Any) -> PlanFluidResult:
    """Adapter from a frozen plan object (harness.workload.plans.Plan): its sessions' arrival, n_turns and
    kind ('burst' marks the burst cohort). Tool times are used for the good state before the trap.
    """
    sess = [s for s in plan.sessions if not bool(_get(s, "refused", False))]  # SHED: turned away
    arrivals = np.array([_get(s, "arrival") for s in sess], float)
    n_turns = np.array([_get(s, "n_turns") for s in sess], int)
    burst = np.array([str(_get(s, "kind", "base")) == "burst" for s in sess], bool)
    tools = [tuple(_get(s, "tool_times", ())) for s in sess]
    return plan_fluid(model, arrivals, n_turns, burst, t_end=t_end, pre_start_tools=tools, **kw)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    if hasattr(obj, name):
        return getattr(obj, name)
    spec = getattr(obj, "spec", None)
    if spec is not None and hasattr(spec, name):
        return getattr(spec, name)
    if default is not None:
        return default
    raise AttributeError(f"plan session has no field {name!r}")
