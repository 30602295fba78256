"""Test design before registration: is each arm's registered outcome reachable, and what is the
cheapest protocol that makes every arm decisive? (`agentload prereg design`, prereg/design_cli.py)

Why: a registration fixes rates, cap and protocol by formula from the calibration alone, and the
formula does not ask whether the rule *can* pass. The first registered real-engine test could only
FAIL (its CAPPED drain could never fit the budget) and its engine time was spent anyway. The design
step answers before any run, from the same inputs the fill reads (Stage C, E0a, E0b), the template,
and the simulator with the cell's fitted cost model:

1. per registered rate, the formula's reachability: CAPPED's drain against the budget, the judged
   window against the rule's min_window, lam > lam_miss for TRAPPED (prereg/decidable.py);
2. per arm and rate, the registered state in k of n *fresh* simulated seeds (never the registered
   ones), at the fitted speed and at the fitted speed moved by +-margin (a real engine is not its
   cost model: prereg/margin.py); flip margins by bisection for the design it proposes. A
   simulated run is judged by the registered rule with the registered references (E0a's), as a
   frozen simulator prediction is;
3. a search (prereg/design_search.py) over the protocol's free knobs for the cheapest design, in
   engine-hours of the full registered test, that is decisive for every arm: the time scale of a
   scaled protocol (every time of the protocol and its rule x time_factor), the time after the
   burst (x post_factor: the duration, the judged window its last part as in the template), the
   burst's size and span, the cap among those the cap rule gives at cap_fraction, and the rates'
   places in the band (fractions across the window, the fill's own parameter).

A design is written as a record (`design_record`) that the fill binds when it lies in the inputs
folder as design.yaml (role "design", by SHA-256): the registration then carries which design
evaluation it was filled under and whether it was decisive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.calibration_summaries import CalibrationInputs, e0a_values, load_inputs
from analysis.rules import arm_expectations
from harness.config import (
    DEFAULT_TOP_RATE,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    TestBundle,
    TestConfig,
    TestReferences,
    WorkloadConfig,
    config_ref,
    load_config,
    load_cost_file,
    parse_config,
    rate_above_top,
)
from harness.errors import ConfigError
from prereg import formula as F
from prereg.decidable import capped_lapses, trapped_unreachable
from prereg.margin import SimRun
from prereg.registration import RegistrationError
from prereg.template import FillParams, Template, load_template, resolve_rule

TIME_PARAMS = ("min_window", "backlog_bin", "recovered_span")  # the rule's times, scaled with its protocol
SCALED_TIMES = ("min_window", "backlog_bin", "hit_bin", "recovered_span")  # the protocol's times a time factor scales


@dataclass(frozen=True)
class Design:
    """One point of the search (the template's own design is all factors 1)."""

    time_factor: float
    post_factor: float
    burst: int
    width_factor: float
    cap_fraction: float
    fractions: tuple[tuple[int, int], ...]
    # protocol times the time factor leaves as the template's: a span a rule estimates a fraction over
    # (RECOVERED's hit) holds fewer turns when scaled, so its call gets noisier than the design step sees
    kept: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "time_factor": self.time_factor,
            "post_factor": self.post_factor,
            "burst": self.burst,
            "width_factor": self.width_factor,
            "cap_fraction": self.cap_fraction,
            "fractions": [list(f) for f in self.fractions],
        }
        if self.kept:
            out["kept_times"] = list(self.kept)
        return out

    def label(self) -> str:
        fr = "/".join(f"{a}/{b}" for a, b in self.fractions)
        kept = f" ({', '.join(self.kept)} kept)" if self.kept and self.time_factor != 1.0 else ""
        return (
            f"t x{self.time_factor:g}{kept} post x{self.post_factor:g} burst {self.burst} span x{self.width_factor:g} "
            f"cap@{self.cap_fraction:g} at {fr}"
        )


@dataclass
class Context:
    """Everything a design is evaluated against, loaded once."""

    template: Template
    template_path: Path
    inputs: CalibrationInputs
    cell: CellConfig  # with the fitted cost: what the simulator runs
    cost_path: Path
    workload: WorkloadConfig
    protocol: ProtocolConfig
    rule: dict[str, Any]
    arms: dict[str, ArmConfig]  # name in the template -> config
    lambda_ref: float
    lambda_miss: float
    # the registered (E0a) all-miss token rate: simulated runs are judged with it, as a frozen prediction's are
    all_miss: float
    curve: list[tuple[int, float]]
    window: F.Window
    seeds: list[int]
    top_rate: float

    @property
    def params(self) -> FillParams:
        return self.template.fill

    def baseline(self) -> Design:
        P = self.params
        return Design(
            1.0, 1.0, self.protocol.burst.size, 1.0, P.cap_fraction, tuple((int(a), int(b)) for a, b in P.fractions)
        )


def load_context(inputs_dir: str | Path, template_path: str | Path, cost_file: str | Path) -> Context:
    """The template, its configs and rule, the calibration inputs and the cell with the fitted cost."""
    tpath = Path(template_path)
    tmpl = load_template(tpath)
    if tmpl.parent is not None or tmpl.based_on is not None:
        raise RegistrationError(
            f"{tpath}: a design is made for a template filled from calibration inputs (no parent, no based_on)"
        )
    base = tpath.parent
    inputs = load_inputs(inputs_dir)
    cell = load_config(config_ref(tmpl.cell or "", "cells"), CellConfig, base)
    if inputs.stage_c.cell != cell.name:
        raise RegistrationError(
            f"{inputs.files['stage-c'][0]}: cell: got {inputs.stage_c.cell!r}; expected the template's cell "
            f"{cell.name!r}"
        )
    cpath = Path(cost_file)
    cost = load_cost_file(cpath)
    ev = e0a_values(inputs.e0a, str(inputs.files["e0a"][0]), tmpl.fill.summary_tolerance)
    if ev.all_miss_token_rate is None:
        raise RegistrationError(
            f"{inputs.files['e0a'][0]}: no all-miss token rate: the TRAPPED rule cannot be judged without it"
        )
    lam_miss = ev.lambda_ref if tmpl.fill.lambda_miss == "lambda_ref" else (ev.lambda_sessions or ev.lambda_ref)
    curve = inputs.stage_c.curve()
    cap = F.cap_rule(curve, fraction=tmpl.fill.cap_fraction, ambiguity=tmpl.fill.cap_ambiguity)
    runs = {(p.multiple, p.seed): p.stable for p in inputs.e0b.points}
    edge = F.e0b_edge(inputs.e0b.grid, inputs.e0b.seeds, runs, tmpl.fill.e0b_edge)
    arms = {}
    for name in tmpl.arms or []:
        arms[name] = load_config(config_ref(name, "arms"), ArmConfig, base)
    sim_cell = cell.model_copy(
        update={
            "cost": cost,
            "cost_file": None,
            "lambda_ref": ev.lambda_ref,
            "all_miss_token_rate": ev.all_miss_token_rate,
        }
    )
    workload = load_config(config_ref(tmpl.workload or "", "workloads"), WorkloadConfig, base)
    return Context(
        template=tmpl,
        template_path=tpath,
        inputs=inputs,
        cell=sim_cell,
        cost_path=cpath,
        workload=workload,
        protocol=load_config(config_ref(tmpl.protocol or "", "protocols"), ProtocolConfig, base),
        rule=resolve_rule(tmpl.rule, tmpl.rule_overrides, base, str(tpath)),
        arms=arms,
        lambda_ref=ev.lambda_ref,
        lambda_miss=lam_miss,
        all_miss=ev.all_miss_token_rate,
        curve=curve,
        window=F.window(cap.mu_star, ev.lambda_ref, edge.edge, low=tmpl.fill.window_low, upper=tmpl.fill.upper_edge),
        seeds=list(tmpl.seeds or []),
        top_rate=tmpl.top_rate if tmpl.top_rate is not None else DEFAULT_TOP_RATE,
    )


# ---------------------------------------------------------------------------------------------
# a design's protocol and rule
# ---------------------------------------------------------------------------------------------
def _r(x: float) -> float:
    return round(float(x), 6)


def protocol_for(base: ProtocolConfig, d: Design) -> ProtocolConfig:
    """The template's protocol with the design's knobs: every time x time_factor (but the design's kept
    ones), the time after the burst x post_factor (the judged window keeps its share of it), the burst's
    size and span."""
    post = base.duration - base.burst.time
    share = (base.window.start - base.burst.time) / post  # where the window starts in the post-burst time (0.6 in E2)
    tb = base.burst.time * d.time_factor
    P = post * d.time_factor * d.post_factor
    data = base.model_dump(mode="json")
    data.update(
        {
            "name": f"{base.name}-design",
            "description": f"{base.name} with {d.label()}",
            "duration": _r(tb + P),
            "burst": {
                "time": _r(tb),
                "size": int(d.burst),
                "width": _r(base.burst.width * d.time_factor * d.width_factor),
            },
            "window": {"start": _r(tb + share * P), "end": _r(tb + P)},
            **{k: _r(getattr(base, k) * (1.0 if k in d.kept else d.time_factor)) for k in SCALED_TIMES},
        }
    )
    return parse_config(data, ProtocolConfig, f"design {d.label()}")


def rule_for(base: dict[str, Any], protocol: ProtocolConfig) -> dict[str, Any]:
    """The template's rule with its time parameters those of the design's protocol."""
    params = {**base["params"], **{k: getattr(protocol, k) for k in TIME_PARAMS if k in base["params"]}}
    return {**base, "params": params}


# ---------------------------------------------------------------------------------------------
# the formula's reachability
# ---------------------------------------------------------------------------------------------
@dataclass
class FormulaEval:
    design: Design
    protocol: ProtocolConfig | None
    rule: dict[str, Any] | None
    multiples: list[float] = field(default_factory=list)
    cap: int | None = None
    mu_cap: float | None = None
    budget_s: float = 0.0
    drains: list[dict[str, Any]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    runs: int = 0
    run_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.reasons

    def engine_hours(self, overhead_s: float) -> float:
        return self.runs * (self.run_s + overhead_s) / 3600.0

    def ci_seconds(self, overhead_s: float) -> float:
        """The reduced CI version: BURST and NOBURST of one seed, one after another."""
        return 2 * (self.run_s + overhead_s)


def formula_eval(ctx: Context, d: Design) -> FormulaEval:
    P = ctx.params
    try:
        protocol = protocol_for(ctx.protocol, d)
    except ConfigError as exc:
        return FormulaEval(d, None, None, reasons=[f"no valid protocol: {str(exc).splitlines()[-1].strip()}"])
    rule = rule_for(ctx.rule, protocol)
    fe = FormulaEval(d, protocol, rule, run_s=protocol.duration)
    placed = F.place_rates(
        ctx.window,
        fractions=d.fractions,
        step=P.rate_step,
        rounding=P.rounding,
        band_low_factor=P.band_low_factor,
        band_high_factor=P.band_high_factor,
    )
    fe.reasons += list(placed.reasons)
    fe.multiples = [float(r.multiple) for r in placed.rates]
    cap = F.cap_rule(
        ctx.curve, fraction=d.cap_fraction, ambiguity=P.cap_ambiguity, ambiguity_fraction=P.cap_ambiguity_fraction
    )
    gated = [a for a, c in ctx.arms.items() if c.gate is not None]
    fe.cap, fe.mu_cap = (cap.cap, cap.mu_cap) if gated else (None, None)
    fe.budget_s = F.drain_budget(
        protocol.duration,
        protocol.burst.time,
        float(rule["params"].get("recovered_span", protocol.recovered_span)),
        P.drain_fraction,
    )
    for m in fe.multiples:
        dr = F.drain(cap.mu_cap, cap.cap, m, ctx.lambda_ref, d.burst, fe.budget_s, ctx.curve, P.drain_formula)
        fe.drains.append(
            {"rate": m, "lambda": dr.lam, "drain_s": dr.drain_s if math.isfinite(dr.drain_s) else None, "fits": dr.fits}
        )
        above = rate_above_top(m, ctx.lambda_ref, ctx.top_rate)
        if above:
            fe.reasons.append(above)
    if gated and fe.drains:
        fe.reasons += capped_lapses(rule, list(ctx.arms), gated, fe.drains, fe.budget_s)
    fe.reasons += trapped_unreachable(rule, list(ctx.arms), fe.multiples, ctx.lambda_ref, ctx.lambda_miss)
    window = protocol.window.end - protocol.window.start
    min_window = float(rule["params"].get("min_window", protocol.min_window))
    if window < min_window:
        fe.reasons.append(f"the judged window {window:g} s is shorter than the rule's min_window {min_window:g} s")
    fe.runs = len(ctx.arms) * len(fe.multiples) * len(ctx.seeds)
    return fe


# ---------------------------------------------------------------------------------------------
# the simulator's reachability
# ---------------------------------------------------------------------------------------------
def sim_bundle(ctx: Context, fe: FormulaEval, seeds: Sequence[int]) -> TestBundle:
    """A test of the design in memory: the cell with its fitted cost, the design's protocol, the
    template's arms and workload, the calibration's references."""
    assert fe.protocol is not None
    arms = {a.name: a for a in ctx.arms.values()}
    refs = TestReferences(
        lambda_ref=ctx.lambda_ref, all_miss_token_rate=ctx.all_miss, source="the design's calibration inputs (E0a)"
    )
    test = TestConfig(
        name=f"design-{ctx.template.name}",
        rule=str(ctx.rule.get("name", "e2")),
        cell=ctx.cell.name,
        workload=ctx.workload.name,
        protocol=fe.protocol.name,
        arms=list(arms),
        rates=list(fe.multiples),
        seeds=list(seeds),
        cap=fe.cap,
        top_rate=ctx.top_rate,
        references=refs,
    )
    return TestBundle(test=test, cell=ctx.cell, workload=ctx.workload, protocol=fe.protocol, arms=arms)


def _expect(rule: dict[str, Any], arm: str) -> list[str]:
    return arm_expectations(rule).get(arm.upper(), [])


def _state(
    bundle: TestBundle, arm: str, rate: float, seed: int, factor: float, rule: dict[str, Any], refs: dict[str, float]
) -> tuple[str, dict[str, Any]]:
    return SimRun(bundle, arm, rate, seed, rule, refs).run(factor)


# A run's simulated state depends on the protocol, the arm (its gate's cap only if it has one), the
# rate, the seed and the speed, not on the design's other knobs: designs that differ only in the cap
# share their BURST and NOBURST runs.
_STATES: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}


def _key(bundle: TestBundle, arm: str, rate: float, seed: int, factor: float) -> tuple[Any, ...]:
    a = next(v for k, v in bundle.arms.items() if k.upper() == arm.upper())
    proto = bundle.protocol.model_dump_json(
        exclude={"name", "description"}
    )  # the description names every knob, the cap's too
    return (proto, arm.upper(), round(rate, 9), seed, round(factor, 9), bundle.test.cap if a.gate else None)


@dataclass
class ArmCount:
    """One arm at one rate and speed factor over the fresh seeds: how many met the registered state."""

    arm: str
    rate: float
    factor: float
    good: int = 0
    done: int = 0
    states: list[str] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)

    def add(self, state: str, stats: dict[str, Any], want: list[str]) -> None:
        """One more run, counted good when its state is one the rule expects of the arm."""
        self.done += 1
        self.good += state in want
        self.states.append(state)
        self.stats.append(stats)

    def to_json(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "rate": self.rate,
            "speed_factor": self.factor,
            "good": self.good,
            "of": self.done,
            "states": self.states,
        }


@dataclass
class SimEval:
    counts: list[ArmCount] = field(default_factory=list)
    # the template's own seeds at the fitted speed: the very plans the registered test will play, as
    # its frozen simulator prediction will call them
    registered: list[ArmCount] = field(default_factory=list)
    decisive: bool = False
    reason: str = ""
    runs: int = 0


def _order(ctx: Context, fe: FormulaEval) -> list[tuple[str, float]]:
    """Arms and rates, the likeliest failure first: an uncapped burst traps least at the lowest rate;
    a run without a burst stays good least, and a gate drains slowest, at the highest."""
    out = []
    for name, arm in ctx.arms.items():
        rates = sorted(fe.multiples, reverse=not (arm.burst and arm.gate is None))
        out += [(name, r) for r in rates]
    return sorted(out, key=lambda x: 0 if (ctx.arms[x[0]].burst and ctx.arms[x[0]].gate is None) else 1)


def _play(
    bundle: TestBundle,
    arm: str,
    rate: float,
    seeds: Sequence[int],
    factor: float,
    rule: dict[str, Any],
    refs: dict[str, float],
    pool: ProcessPoolExecutor | None,
) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """Each seed's simulated (state, stats) at one arm, rate and speed, simulating only what
    `_STATES` does not hold yet (in the pool when there is one and more than one is new); and how
    many were simulated."""
    new = [s for s in seeds if _key(bundle, arm, rate, s, factor) not in _STATES]
    if pool is not None and len(new) > 1:
        got = list(pool.map(_state, *zip(*[(bundle, arm, rate, s, factor, rule, refs) for s in new])))
    else:
        got = [_state(bundle, arm, rate, s, factor, rule, refs) for s in new]
    _STATES.update({_key(bundle, arm, rate, s, factor): g for s, g in zip(new, got)})
    return [_STATES[_key(bundle, arm, rate, s, factor)] for s in seeds], len(new)


def _registered(
    ctx: Context,
    bundle: TestBundle,
    arm: str,
    rate: float,
    want: list[str],
    refs: dict[str, float],
    rule: dict[str, Any],
    pool: ProcessPoolExecutor | None,
) -> tuple[ArmCount, int]:
    """An arm at one rate on the template's own seeds at the fitted speed, and how many runs were
    simulated for it. Why besides the fresh seeds: k of n fresh seeds estimates how often a run
    lands in its state, and with n = 5 a design whose runs land there three times in four still
    passes 4 of 5 more often than not; the registered seeds' plans are the ones the test will play,
    and a design under which the simulator already calls them out of their states is one its own
    frozen prediction would call a FAIL."""
    c = ArmCount(arm.upper(), rate, 1.0)
    played, simulated = _play(bundle, arm, rate, ctx.seeds, 1.0, rule, refs, pool)
    for st, stats in played:
        c.add(st, stats, want)
    return c, simulated


def sim_eval(
    ctx: Context,
    fe: FormulaEval,
    *,
    seeds: Sequence[int],
    need: int,
    margin: float,
    jobs: int = 1,
    pool: ProcessPoolExecutor | None = None,
    early_exit: bool = True,
) -> SimEval:
    """Each arm's registered state in `need` of `seeds` at the fitted speed and at 1 -+ margin;
    with `early_exit`, stops at the first arm x rate x speed that cannot reach `need` (else every
    seed of every arm x rate at the fitted speed is run: the full table of a design)."""
    bundle = sim_bundle(ctx, fe, seeds)
    refs = {"lambda_ref": ctx.lambda_ref, "all_miss_token_rate": ctx.all_miss}
    rule = fe.rule or ctx.rule
    out = SimEval()
    factors = [1.0] + ([1.0 - margin, 1.0 + margin] if margin > 0 else [])
    for arm, rate in _order(ctx, fe):
        want = _expect(rule, arm)
        for f in factors:
            c = ArmCount(arm.upper(), rate, f)
            out.counts.append(c)
            todo = list(seeds)
            while todo and (not early_exit or (c.good < need and (c.done - c.good) <= len(seeds) - need)):
                batch, todo = todo[: max(1, jobs)], todo[max(1, jobs) :]
                played, simulated = _play(bundle, arm, rate, batch, f, rule, refs, pool)
                out.runs += simulated
                for st, stats in played:
                    c.add(st, stats, want)
            if c.good < need and not out.reason:
                out.reason = (
                    f"{arm.upper()} at {rate:g} x lambda_ref, speed x{f:g}: {'/'.join(want)} in {c.good} of "
                    f"{c.done} fresh seeds ({', '.join(c.states)}); needs {need} of {len(seeds)}"
                )
            if f == 1.0 and not out.reason and ctx.seeds:
                r, simulated = _registered(ctx, bundle, arm, rate, want, refs, rule, pool)
                out.registered.append(r)
                out.runs += simulated
                if r.good < r.done:
                    out.reason = (
                        f"{arm.upper()} at {rate:g} x lambda_ref: {'/'.join(want)} in {r.good} of the template's "
                        f"{r.done} registered seeds' own plans ({', '.join(r.states)}), as its frozen prediction "
                        "would call them"
                    )
            if out.reason and early_exit:
                return out
            if not early_exit and f == 1.0 and c.good < need:
                break  # the speed factors of an arm that fails at the fitted speed add nothing to the table
    out.decisive = not out.reason
    return out
