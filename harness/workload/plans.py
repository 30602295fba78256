"""Frozen session plans with common random numbers (paper App. E.2).

A plan is everything the open-loop client will do that can be fixed before a run: which sessions
arrive, when, with how many turns, which tool times and which token seed. It is generated once,
written to Parquet and identified by the SHA-256 of the file's bytes; runs are driven by the file.

Common random numbers, and how they are obtained:

* Base arrivals. One Poisson process per seed at an absolute top rate R (sessions/s), each point
  carrying a uniform mark. A run at absolute rate lam keeps the points with mark < lam / R
  (independent thinning), so a lower rate's arrival times are a subset of a higher rate's, in every
  cell, since thinning works on absolute rates. The process is drawn in fixed blocks, each from its
  own counter-based stream, so its first part does not depend on the run's duration.
* The top rate. R is part of the plan's identity (recorded in its metadata, so `regenerate` needs
  nothing else): plans are nested across rates, arms and cells only when they share R. The test
  sets it (TestConfig.top_rate); its default DEFAULT_TOP_RATE = 2.0 sessions/s is the paper's, far
  above any A100 or H200 rate it registered, and keeps every plan made before R was a parameter
  byte-identical. A cell faster than that (a CPU cell at ~14 sessions/s, a large H200 pool, a
  data-parallel deployment) registers a higher R; a rate above R cannot be planned.
* Session identity. The i-th *kept* arrival plays spec ``draw_session(workload, seed, STREAM_BASE,
  i)``, so the i-th arriving session has the same turn count, tool times and tokens at every rate.
* Burst. Offsets uniform in [0, width) from their own per-seed stream, in draw order; a burst of n
  takes the first n offsets and the specs ``STREAM_BURST`` 0..n-1 (the draw of BURST_DRAW = 200 is
  the same everywhere). Rows are then ordered by time.
* Perturbations are transforms of the same draw. CUT keeps, after its start, only the points with
  mark < lam' / R (a further thinning with the same marks). SHED keeps its arrivals in the
  plan, flagged ``refused``, so later sessions keep their identity. MIRROR is a different workload
  file: the same uniforms go through a different turn law.
* Client policies are not plan content: gates (CAPPED, rescue) and TOOLSLOW (which depends on when
  a tool call starts, a run-time quantity) are applied by the client from the arm config, which the
  run's meta.json records. So BURST, CAPPED and rescue plans of a seed and rate are byte-identical,
  and a TOOLSLOW arm replays its NOBURST plan byte for byte.

Determinism: rows in a fixed order, no timestamps, canonical JSON metadata in the Parquet schema,
a fixed writer configuration. The same inputs give the same bytes in any process.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from harness.config import ArmConfig, Cut, ProtocolConfig, Shed, WorkloadConfig, parse_config
from harness.workload.draws import STREAM_BASE, STREAM_BURST, SessionSpec, _generator, draw_session

DEFAULT_TOP_RATE = 2.0  # sessions/s: the paper's base process; a test may register another (TestConfig.top_rate)
TOP_RATE = DEFAULT_TOP_RATE  # the name older callers import
BURST_DRAW = 200  # the burst draw every burst size takes a prefix of
GENERATOR_VERSION = 1  # bump on any change that alters a plan's bytes for the same inputs
META_KEY = b"agentload.plan"

_ARRIVAL_DOMAIN = 0x617272  # separates the arrival process from every session stream
_BURST_DOMAIN = 0x627273
_BLOCK = 4096  # points of the top-rate process drawn per counter-based block

_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("stream", pa.int32(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
        pa.field("arrival", pa.float64(), nullable=False),
        pa.field("n_turns", pa.int32(), nullable=False),
        pa.field("tool_times", pa.list_(pa.float64()), nullable=False),
        pa.field("token_seed", pa.int64(), nullable=False),
        pa.field("refused", pa.bool_(), nullable=False),
    ]
)


class PlanError(ValueError):
    """A plan cannot be made or read as asked; the message says what to change."""


@dataclass(frozen=True)
class Plan:
    """A frozen plan. ``sessions[i]`` is client-wide session id i (the row in the file)."""

    sessions: tuple[SessionSpec, ...]
    meta: dict[str, Any]
    sha256: str | None = None  # of the file's bytes; None until written or when built in memory

    @property
    def workload(self) -> WorkloadConfig:
        return parse_config(self.meta["workload"], WorkloadConfig, "plan metadata: workload")

    @property
    def protocol(self) -> ProtocolConfig:
        return parse_config(self.meta["protocol"], ProtocolConfig, "plan metadata: protocol")

    @property
    def rate_abs(self) -> float:
        return float(self.meta["rate_abs"])

    @property
    def lambda_ref(self) -> float:
        return float(self.meta["lambda_ref"])

    @property
    def top_rate(self) -> float:
        return float(self.meta.get("top_rate", DEFAULT_TOP_RATE))

    def of_kind(self, kind: str) -> list[SessionSpec]:
        return [s for s in self.sessions if s.kind == kind]

    def nominal_rate(self, t: float) -> float:
        """Absolute base arrival rate at time t (piecewise constant: CUT changes it)."""
        cut = self.meta["arm"]["cut"]
        if cut is not None and t >= cut["start"]:
            return float(cut["rate"]) * self.lambda_ref
        return self.rate_abs

    def expected_arrivals(self, start: float, end: float) -> float:
        """Integral of the nominal base rate over [start, end)."""
        cut = self.meta["arm"]["cut"]
        if cut is None or end <= cut["start"]:
            return self.rate_abs * (end - start)
        c = max(start, float(cut["start"]))
        return self.rate_abs * max(0.0, c - start) + float(cut["rate"]) * self.lambda_ref * (end - c)


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------
def top_process(seed: int, horizon: float, top_rate: float = DEFAULT_TOP_RATE) -> tuple[np.ndarray, np.ndarray]:
    """Points of the per-seed Poisson process at `top_rate` in [0, horizon) and their uniform marks."""
    times: list[np.ndarray] = []
    marks: list[np.ndarray] = []
    start = 0.0
    block = 0
    while start < horizon:
        g = _generator(_ARRIVAL_DOMAIN, seed, block)
        gaps = g.exponential(1.0 / top_rate, _BLOCK)
        m = g.random(_BLOCK)
        t = start + np.cumsum(gaps)
        times.append(t)
        marks.append(m)
        start = float(t[-1])
        block += 1
    all_t = np.concatenate(times) if times else np.empty(0)
    all_m = np.concatenate(marks) if marks else np.empty(0)
    keep = all_t < horizon
    return all_t[keep], all_m[keep]


def rate_above_top(multiple: float, lambda_ref: float, top_rate: float) -> str | None:
    """Why `multiple` x lambda_ref cannot be thinned from a base stream at `top_rate`, or None.

    One check for the test loader (before any run) and the plan generator (the last line of defence)."""
    lam = multiple * lambda_ref
    if lam <= top_rate:
        return None
    return (
        f"{multiple:g} x lambda_ref {lambda_ref:g} = {lam:.4g} sessions/s exceeds the plan's top rate of "
        f"{top_rate:g} sessions/s; expected at most {top_rate / lambda_ref:.4g} x lambda_ref, or a test "
        f"'top_rate' of at least {lam:.4g} (a different top rate makes different plans, nested only among themselves)"
    )


def burst_offsets(seed: int, n: int, width: float) -> np.ndarray:
    """Offsets of a burst of n from its start, in draw order: always a prefix of the same draw."""
    u = _generator(_BURST_DOMAIN, seed).random(max(n, BURST_DRAW))
    return u[:n] * width


def plan_arm(arm: ArmConfig, protocol: ProtocolConfig) -> dict[str, Any]:
    """The part of an arm that changes the plan: burst size, CUT, SHED. Gates and TOOLSLOW do not."""
    size = (arm.burst_size if arm.burst_size is not None else protocol.burst.size) if arm.burst else 0
    return {
        "burst_size": int(size),
        "cut": arm.cut.model_dump(mode="json") if arm.cut else None,
        "shed": arm.shed.model_dump(mode="json") if arm.shed else None,
    }


def _config_json(model: WorkloadConfig | ProtocolConfig) -> dict[str, Any]:
    # The description is prose; leaving it out keeps a reworded comment from changing a plan's hash.
    data = model.model_dump(mode="json")
    data.pop("description", None)
    return data


def make_plan(
    workload: WorkloadConfig,
    protocol: ProtocolConfig,
    arm: ArmConfig,
    rate: float,
    lambda_ref: float,
    seed: int,
    top_rate: float = DEFAULT_TOP_RATE,
) -> Plan:
    """Build the plan of one (workload, protocol, arm, rate x lambda_ref, seed) from the base
    stream at `top_rate` sessions/s (the test's registered top rate)."""
    return _build(_config_json(workload), _config_json(protocol), plan_arm(arm, protocol), rate, lambda_ref, seed, top_rate)


def regenerate(plan: Plan) -> Plan:
    """Rebuild a plan from its own metadata: the file alone is enough to reproduce it."""
    m = plan.meta
    if m.get("generator_version") != GENERATOR_VERSION:
        raise PlanError(
            f"plan was made by generator version {m.get('generator_version')}; this code is version "
            f"{GENERATOR_VERSION}: check out the commit that made it to regenerate it"
        )
    return _build(m["workload"], m["protocol"], m["arm"], m["rate"], m["lambda_ref"], m["seed"], m.get("top_rate", DEFAULT_TOP_RATE))


def _build(
    workload_json: dict[str, Any],
    protocol_json: dict[str, Any],
    arm_part: dict[str, Any],
    rate: float,
    lambda_ref: float,
    seed: int,
    top_rate: float = DEFAULT_TOP_RATE,
) -> Plan:
    workload = parse_config(workload_json, WorkloadConfig, "plan workload")
    protocol = parse_config(protocol_json, ProtocolConfig, "plan protocol")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PlanError(f"seed: got {seed!r}; expected a non-negative integer")
    for name, value in (("rate", rate), ("lambda_ref", lambda_ref), ("top_rate", top_rate)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise PlanError(f"{name}: got {value!r}; expected a positive number")
    rate_abs = float(rate) * float(lambda_ref)
    cut = Cut(**arm_part["cut"]) if arm_part["cut"] else None
    shed = Shed(**arm_part["shed"]) if arm_part["shed"] else None
    top_rate = float(top_rate)
    for label, mult in (("rate", float(rate)), ("cut.rate", cut.rate if cut else 0.0)):
        problem = rate_above_top(mult, float(lambda_ref), top_rate)
        if problem:
            raise PlanError(f"{label}: {problem}")

    if cut is not None and cut.rate > float(rate):
        # The cut keeps the points already kept whose marks pass a second threshold, so it can
        # only lower the rate; a higher cut rate would leave the arrivals unchanged while the
        # nominal rate (rate_report, ks_exponential) claimed the higher one.
        raise PlanError(
            f"cut.rate: got {cut.rate} x lambda_ref; expected at most the run's rate {float(rate)} x lambda_ref "
            "(a cut thins the base stream, it cannot raise it)"
        )
    duration = protocol.duration
    t, marks = top_process(int(seed), duration, top_rate)
    keep = marks < rate_abs / top_rate
    if cut is not None:
        after = t >= cut.start
        keep &= ~after | (marks < cut.rate * lambda_ref / top_rate)
    base_t = t[keep]

    rows: list[SessionSpec] = [
        draw_session(workload, int(seed), STREAM_BASE, i, float(a)) for i, a in enumerate(base_t)
    ]
    n_burst = int(arm_part["burst_size"])
    if n_burst > 0:
        offsets = burst_offsets(int(seed), n_burst, protocol.burst.width)
        for j, off in enumerate(offsets):
            rows.append(draw_session(workload, int(seed), STREAM_BURST, j, float(protocol.burst.time + off)))
    if shed is not None:
        lo, hi = shed.start, shed.start + shed.duration
        rows = [replace(s, refused=True) if lo <= s.arrival < hi else s for s in rows]
    rows.sort(key=lambda s: (s.arrival, s.stream, s.index))

    meta = {
        "format": "agentload-plan",
        "generator_version": GENERATOR_VERSION,
        "seed": int(seed),
        "rate": float(rate),
        "lambda_ref": float(lambda_ref),
        "rate_abs": rate_abs,
        "top_rate": top_rate,
        "workload": workload_json,
        "protocol": protocol_json,
        "arm": arm_part,
        "counts": {
            "base": int(len(base_t)),
            "burst": n_burst,
            "refused": sum(1 for s in rows if s.refused),
            "turns": sum(s.n_turns for s in rows),
        },
    }
    return Plan(sessions=tuple(rows), meta=meta)


# ---------------------------------------------------------------------------------------------
# file format
# ---------------------------------------------------------------------------------------------
def _canonical(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def plan_bytes(plan: Plan) -> bytes:
    """The exact bytes of the plan file: a fixed schema, fixed row order, canonical metadata."""
    s = plan.sessions
    table = pa.table(
        {
            "kind": pa.array([x.kind for x in s], pa.string()),
            "stream": pa.array([x.stream for x in s], pa.int32()),
            "index": pa.array([x.index for x in s], pa.int32()),
            "arrival": pa.array([x.arrival for x in s], pa.float64()),
            "n_turns": pa.array([x.n_turns for x in s], pa.int32()),
            "tool_times": pa.array([list(x.tool_times) for x in s], pa.list_(pa.float64())),
            "token_seed": pa.array([x.token_seed for x in s], pa.int64()),
            "refused": pa.array([x.refused for x in s], pa.bool_()),
        },
        schema=_SCHEMA.with_metadata({META_KEY: _canonical(plan.meta)}),
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", compression_level=3, use_dictionary=["kind"], version="2.6")
    return sink.getvalue()


def write_plan(plan: Plan, path: Path | str) -> str:
    """Write the plan atomically and return the SHA-256 of its bytes."""
    data = plan_bytes(plan)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def read_plan(path: Path | str) -> Plan:
    """Read a plan file; ``sha256`` is that of the bytes read, for the run's meta.json."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"{path}: cannot read plan: {exc.strerror}") from None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise PlanError(f"{path}: not a Parquet plan file ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise PlanError(f"{path}: Parquet file without plan metadata (key {META_KEY.decode()}); not a plan")
    meta = orjson.loads(raw)
    cols = table.to_pydict()
    sessions = tuple(
        SessionSpec(
            stream=cols["stream"][i],
            index=cols["index"][i],
            arrival=cols["arrival"][i],
            n_turns=cols["n_turns"][i],
            tool_times=tuple(cols["tool_times"][i]),
            token_seed=cols["token_seed"][i],
            refused=cols["refused"][i],
        )
        for i in range(table.num_rows)
    )
    return Plan(sessions=sessions, meta=meta, sha256=hashlib.sha256(data).hexdigest())


# ---------------------------------------------------------------------------------------------
# realized arrivals against nominal
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowRate:
    """Arrivals a plan delivers in a window against what its nominal rate promises."""

    label: str
    kind: str  # 'base' (Poisson stream, refused included) or 'burst'
    start: float
    end: float
    arrivals: int
    refused: int
    expected: float

    @property
    def realized_rate(self) -> float:
        return self.arrivals / (self.end - self.start)

    @property
    def deviation(self) -> float:
        """Relative shortfall (<0) or excess (>0) of arrivals against nominal."""
        return self.arrivals / self.expected - 1.0 if self.expected > 0 else float("nan")

    @property
    def z(self) -> float:
        """Poisson standard deviations from nominal (0 for the burst, which is exact by design)."""
        return (self.arrivals - self.expected) / math.sqrt(self.expected) if self.kind == "base" and self.expected > 0 else 0.0


def default_windows(plan: Plan) -> list[tuple[str, float, float]]:
    """Before the burst, the burst, burst to window, the evaluation window, the run; CUT/SHED spans."""
    p = plan.protocol
    b, w = p.burst.time, p.window
    out: list[tuple[str, float, float]] = []
    if p.burst.size > 0 and 0 < b < p.duration:
        out.append(("before burst", 0.0, b))
        out.append(("during burst", b, b + p.burst.width))
        if w.start > b:
            out.append(("burst to window", b, w.start))
    elif w.start > 0:
        out.append(("before window", 0.0, w.start))
    out.append(("evaluation window", w.start, w.end))
    cut = plan.meta["arm"]["cut"]
    if cut is not None:
        out.append(("after cut", float(cut["start"]), p.duration))
    shed = plan.meta["arm"]["shed"]
    if shed is not None:
        out.append(("shed", float(shed["start"]), float(shed["start"]) + float(shed["duration"])))
    out.append(("whole run", 0.0, p.duration))
    return out


def rate_report(plan: Plan, windows: Sequence[tuple[str, float, float]] | None = None) -> list[WindowRate]:
    """Realized base arrivals per window against nominal, plus the burst's own row."""
    base = np.array([s.arrival for s in plan.sessions if s.stream == STREAM_BASE])
    base_ref = np.array([s.arrival for s in plan.sessions if s.stream == STREAM_BASE and s.refused])
    out: list[WindowRate] = []
    for label, lo, hi in windows if windows is not None else default_windows(plan):
        n = int(((base >= lo) & (base < hi)).sum())
        r = int(((base_ref >= lo) & (base_ref < hi)).sum())
        out.append(WindowRate(label, "base", lo, hi, n, r, plan.expected_arrivals(lo, hi)))
    n_burst = int(plan.meta["arm"]["burst_size"])
    if n_burst:
        t0 = float(plan.meta["protocol"]["burst"]["time"])
        w = float(plan.meta["protocol"]["burst"]["width"])
        bursts = [s for s in plan.sessions if s.stream == STREAM_BURST]
        out.append(WindowRate("burst sessions", "burst", t0, t0 + w, len(bursts), sum(s.refused for s in bursts), float(n_burst)))
    return out


@dataclass(frozen=True)
class KSResult:
    statistic: float
    pvalue: float
    n: int


def ks_exponential(plan: Plan) -> KSResult:
    """KS test of the base inter-arrival times against the nominal exponential law.

    Gaps are rescaled by the nominal rate's integral (time rescaling), so a plan whose rate changes
    at a CUT is tested against Exp(1) as a whole.
    """
    from scipy import stats

    times = sorted(s.arrival for s in plan.sessions if s.stream == STREAM_BASE)
    prev = 0.0
    gaps = []
    for t in times:
        gaps.append(plan.expected_arrivals(prev, t))
        prev = t
    if len(gaps) < 2:
        return KSResult(float("nan"), float("nan"), len(gaps))
    res = stats.kstest(np.asarray(gaps), "expon")
    return KSResult(float(res.statistic), float(res.pvalue), len(gaps))


# ---------------------------------------------------------------------------------------------
# command line: agentload plan make / show
# ---------------------------------------------------------------------------------------------
def register(cli: Any) -> None:
    """Add `agentload plan make|show` (see harness/cli.py for the pattern)."""
    p = cli.command("plan", group="workload", help="make a frozen session plan (Parquet + SHA-256), or show one")
    p.set_defaults(_parser=p)
    sub = p.add_subparsers(dest="plan_action", metavar="ACTION")
    mk = sub.add_parser("make", help="generate a plan and print its SHA-256", description=(
        "Generate the plan of one (workload, protocol, arm, rate, seed) and write it as Parquet. "
        "The same inputs give the same bytes (and hash) in any process."
    ))
    mk.add_argument("--workload", required=True, help="workload config (name under configs/workloads or a path)")
    mk.add_argument("--protocol", required=True, help="protocol config")
    mk.add_argument("--arm", required=True, help="arm config")
    mk.add_argument("--rate", required=True, type=float, help="arrival rate as a multiple of lambda_ref")
    ref = mk.add_mutually_exclusive_group(required=True)
    ref.add_argument("--lambda-ref", type=float, help="reference rate lambda_ref, sessions/s")
    ref.add_argument("--cell", help="take lambda_ref from this cell config")
    mk.add_argument("--seed", required=True, type=int)
    mk.add_argument("--top-rate", type=float, default=DEFAULT_TOP_RATE,
                    help=f"sessions/s of the base stream rates are thinned from (default {DEFAULT_TOP_RATE:g}, the paper's; "
                    "a test registers its own as top_rate)")
    mk.add_argument("--out", help="output file (default: plan-<arm>-r<rate>-s<seed>.parquet)")
    mk.set_defaults(func=_cmd_make)
    sh = sub.add_parser("show", help="sessions, turns and realized arrival rates against nominal",
                        description="Summarize a plan: sessions, turns, realized arrival rate per window "
                        "against nominal, and a KS test of base inter-arrival times against the exponential law.")
    sh.add_argument("plan", help="plan file")
    sh.add_argument("--rows", type=int, default=10, help="session rows to list (default 10; 0 for none)")
    sh.add_argument("--all", action="store_true", help="list every session")
    sh.add_argument("--window", action="append", default=None, metavar="START:END",
                    help="report this window (seconds) instead of the defaults; repeatable")
    sh.set_defaults(func=_cmd_show)
    cli.user_errors(PlanError)


def _load_kind(ref: str, folder: str, model: type) -> Any:
    from harness.config import config_ref, load_config

    return load_config(config_ref(ref, folder), model)


def _cmd_make(args: Any) -> int:
    from harness.config import CellConfig

    workload = _load_kind(args.workload, "workloads", WorkloadConfig)
    protocol = _load_kind(args.protocol, "protocols", ProtocolConfig)
    arm = _load_kind(args.arm, "arms", ArmConfig)
    lam = args.lambda_ref
    if args.cell is not None:
        cell = _load_kind(args.cell, "cells", CellConfig)
        if cell.lambda_ref is None:
            raise PlanError(f"cell {cell.name!r} has no lambda_ref (run E0a and record it, or pass --lambda-ref)")
        lam = cell.lambda_ref
    plan = make_plan(workload, protocol, arm, args.rate, lam, args.seed, args.top_rate)
    out = Path(args.out or f"plan-{arm.name}-r{args.rate:g}-s{args.seed}.parquet")
    digest = write_plan(plan, out)
    c = plan.meta["counts"]
    print(f"{digest}  {out}")
    print(
        f"# {c['base']} base + {c['burst']} burst sessions ({c['refused']} refused), {c['turns']} turns; "
        f"rate {args.rate:g} x {lam:g} = {plan.rate_abs:.6g} sessions/s, seed {args.seed}",
        file=sys.stderr,
    )
    return 0


def _parse_window(text: str) -> tuple[str, float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise PlanError(f"--window: got {text!r}; expected START:END in seconds, e.g. 5700:8700") from None
    if b <= a:
        raise PlanError(f"--window: got {text!r}; expected END > START")
    return (f"[{a:g}, {b:g})", a, b)


def _cmd_show(args: Any) -> int:
    from rich.console import Console
    from rich.table import Table

    from harness.workload.draws import expected_turns

    plan = read_plan(args.plan)
    windows = [_parse_window(w) for w in args.window] if args.window else None
    m = plan.meta
    con = Console(width=None if sys.stdout.isatty() else 110)
    wl = plan.workload
    head = Table.grid(padding=(0, 2))
    head.add_row("plan", str(args.plan))
    head.add_row("sha256", plan.sha256 or "")
    head.add_row("seed / rate", f"{m['seed']} / {m['rate']:g} x lambda_ref {m['lambda_ref']:g} = {m['rate_abs']:.6g} sessions/s")
    head.add_row("workload", f"{wl.name}: T = min(Geometric(1/{wl.turns.mean:g}), {wl.turns.cap}), E[T] = {expected_turns(wl):.3f}; "
                 f"tool time Exp(mean {wl.tool_time.mean:g} s)")
    arm = m["arm"]
    head.add_row("protocol", f"{m['protocol']['name']}: {m['protocol']['duration']:g} s; burst {arm['burst_size']} at "
                 f"{m['protocol']['burst']['time']:g} s; cut {arm['cut']}; shed {arm['shed']}")
    head.add_row("generator", f"version {m['generator_version']}, top rate {m['top_rate']:g} sessions/s")
    con.print(head)

    summ = Table(title="sessions and turns")
    for col in ("kind", "sessions", "refused", "turns", "mean turns", "tool time (s)"):
        summ.add_column(col, justify="right" if col != "kind" else "left")
    for kind in ("base", "burst"):
        ss = plan.of_kind(kind)
        if not ss:
            continue
        turns = sum(s.n_turns for s in ss)
        summ.add_row(kind, str(len(ss)), str(sum(s.refused for s in ss)), str(turns),
                     f"{turns / len(ss):.2f}", f"{sum(sum(s.tool_times) for s in ss):.0f}")
    con.print(summ)

    n_rows = len(plan.sessions) if args.all else max(0, args.rows)
    if n_rows:
        rows = Table(title=f"sessions (first {min(n_rows, len(plan.sessions))} of {len(plan.sessions)}; id = row)")
        for col in ("id", "kind", "index", "arrival s", "turns", "tool s", "refused", "token seed"):
            rows.add_column(col, justify="right", no_wrap=True)
        for i, s in enumerate(plan.sessions[:n_rows]):
            rows.add_row(str(i), s.kind, str(s.index), f"{s.arrival:.3f}", str(s.n_turns),
                         f"{sum(s.tool_times):.1f}", "yes" if s.refused else "", f"{s.token_seed:016x}")
        con.print(rows)

    rt = Table(title="arrivals against nominal (base stream, refused included; z in Poisson s.d.)")
    for col in ("window", "span s", "arrivals", "nominal", "dev", "z", "x lambda_ref", "refused"):
        rt.add_column(col, justify="right" if col != "window" else "left", no_wrap=True)
    for r in rate_report(plan, windows):
        rt.add_row(r.label, f"[{r.start:g}, {r.end:g})", str(r.arrivals), f"{r.expected:.1f}", f"{100 * r.deviation:+.1f}%",
                   f"{r.z:+.2f}" if r.kind == "base" else "", f"{r.realized_rate / plan.lambda_ref:.3f}" if r.kind == "base" else "",
                   str(r.refused))
    con.print(rt)
    ks = ks_exponential(plan)
    con.print(f"KS test of base inter-arrival times against the nominal exponential law (time-rescaled): "
              f"D = {ks.statistic:.4f}, p = {ks.pvalue:.3g}, n = {ks.n}")
    return 0
