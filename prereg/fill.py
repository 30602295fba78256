"""Fill a registration by formula from committed calibration inputs and a template.

`fill_registration(inputs_dir, template_path)` is a pure function of the bytes of the three input
files and the template (and of the configs the template names): it reads no clock and no git
state, so the same inputs give a byte-identical registration. The steps, each recorded in the
registration's `fill` trace (paper §2, App. E.3–E.5, E.11; rules digest §1):

1. references from E0a (lambda_ref, its standard error, the all-miss token rate);
2. mu(n) from Stage C, mu* and its argmax; the E0b edge, first unstable multiple, monotone flag;
3. the window (1, min(mu*/lambda_ref, edge)) with its binding term;
4. the rates at one and two thirds across, rounded to 0.05, each strictly inside the margin band,
   or status INCOMPLETE with the reason;
5. the cap (smallest n with mu(n) >= 0.95 mu*), argmax, the ambiguity flag;
6. CAPPED drain per rate against 80% of the time after the burst, the largest rate that fits;
7. predictions, kill conditions, warnings; the SHA-256 of every input and every frozen plan.

A template with a `parent` or `based_on` fills from another registration (prereg/derive.py); the
parts every way shares are in prereg/filling.py.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.calibration_summaries import CalibrationInputs, E0aValues, InputError, e0a_values, load_inputs
from analysis.rules import arm_expectation, arm_expectations
from harness.config import (
    DEFAULT_START_LATENESS_P99,
    DEFAULT_TOP_RATE,
    CellConfig,
    ProtocolConfig,
    WorkloadConfig,
    config_ref,
    load_config,
    rate_above_top,
)
from prereg import formula as F
from prereg.derive import derive_exploratory, fill_based_on
from prereg.design_record import bound_design
from prereg.filling import FillResult, arm_configs, cell_dump, plan_hashes, rel_path, repo_root_of
from prereg.registration import (
    FORMAT,
    FORMAT_VERSION,
    RegistrationError,
    registration_from_data,
    write_registration,
)
from prereg.template import FillParams, Template, load_template, resolve_rule


def _f(d: Any) -> float | None:
    return None if d is None else float(d)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _kill_conditions(
    arms: list[str], rule: dict[str, Any], fits: list[float], noise: dict[str, Any]
) -> list[dict[str, Any]]:
    """The E2 registration's four kill conditions (App. E.11), as data for prereg.kill."""
    up = {a.upper() for a in arms} if arm_expectations(rule) else set()
    out: list[dict[str, Any]] = []
    if "NOBURST" in up:
        out.append(
            {
                "id": "K1",
                "kind": "arm_fails_fraction",
                "description": "NOBURST not good in at least one third of the seeds at a registered rate",
                "params": {"arm": "NOBURST", "fraction": [1, 3], "quantifier": "any"},
                "frozen": None,
            }
        )
    if "BURST" in up:
        out.append(
            {
                "id": "K2",
                "kind": "arm_fails_fraction",
                "description": "BURST not trapped in two thirds of the seeds at every registered rate",
                "params": {"arm": "BURST", "fraction": [2, 3], "quantifier": "every"},
                "frozen": None,
            }
        )
    if "CAPPED" in up and "BURST" in up:
        out.append(
            {
                "id": "K3",
                "kind": "capped_not_recovered",
                "description": (
                    "CAPPED fails to recover in a seed whose BURST run is trapped, at a rate whose drain fits"
                ),
                "params": {"burst_arm": "BURST", "capped_arm": "CAPPED", "rates": fits},
                "frozen": None,
            }
        )
    out.append(
        {
            "id": "K4",
            "kind": "window_noise",
            "description": (
                "the window is empty or narrower than the noise (noise_factor x relative s.e. of lambda_ref)"
            ),
            "params": {},
            "frozen": noise,
        }
    )
    return out


def _predictions(
    arms: list[str], rule: dict[str, Any], multiples: list[float], drains: dict[float, F.Drain], gated: set[str]
) -> list[dict[str, Any]]:
    if not arm_expectations(rule):
        return []  # a rule without per-arm states (a family's) carries its outcomes in its spec
    out = []
    for m in multiples:
        for a in arms:
            expect = arm_expectation(rule, a)
            pred: dict[str, Any] = {"rate": m, "arm": a, "expect": expect}
            if a in gated:
                d = drains.get(m)
                if d is not None and not d.fits:
                    pred["expect"] = []
                    pred["note"] = "not predicted: the gate's drain does not fit the budget"
                else:
                    pred["note"] = "recovers because the drain fits the budget"
            out.append(pred)
    return out


def fill_registration(
    inputs_dir: str | Path | None, template_path: str | Path, *, repo_root: Path | None = None, name: str | None = None
) -> FillResult:
    """The registration the formula gives for these inputs and this template (not written).
    `name` replaces the template's registration name (one template, several cells' inputs)."""
    tpath = Path(template_path)
    tmpl = load_template(tpath)
    if name is not None:
        tmpl = tmpl.model_copy(update={"name": name})
    root = repo_root if repo_root is not None else repo_root_of(tpath)
    if tmpl.parent is not None:
        return derive_exploratory(tmpl, tpath, root)
    if tmpl.based_on is not None:
        return fill_based_on(tmpl, tpath, root)
    if inputs_dir is None:
        raise RegistrationError(f"{tpath}: this template fills from calibration inputs; give --inputs DIR")
    inputs = load_inputs(inputs_dir)
    return _fill(tmpl, tpath, inputs, root)


@dataclass(frozen=True)
class _Setting:
    """What the template names, loaded: the configs, the resolved rule, the fill parameters."""

    params: FillParams
    base: Path
    src: str
    cell: CellConfig
    workload: WorkloadConfig
    protocol: ProtocolConfig
    rule: dict[str, Any]


@dataclass(frozen=True)
class _References:
    """Step 1: E0a's references, and why the registration cannot be FILLED for want of them."""

    values: E0aValues
    lam_ref: float
    lam_miss: float | None
    reasons: list[str]


@dataclass(frozen=True)
class _Shape:
    """Step 2: mu(n) from Stage C with its cap reading, and the E0b edge."""

    curve: list[tuple[int, float]]
    cap: F.Cap
    edge: F.Edge


@dataclass(frozen=True)
class _Rates:
    """Steps 3-4: the window, the rates placed in it, and why any of them fails."""

    window: F.Window
    placed: F.Placement
    multiples: list[float]
    top_rate: float
    formula_status: str
    reasons: list[str]


@dataclass(frozen=True)
class _Drains:
    """Steps 5-6: the CAPPED drain per rate against the budget, and the window's noise."""

    budget: float
    burst: int
    per_rate: dict[float, F.Drain]
    largest_fitting_multiple: float | None
    width: float
    noise: dict[str, Any]

    @property
    def fits(self) -> list[float]:
        return [m for m, d in self.per_rate.items() if d.fits]


def _setting(tmpl: Template, tpath: Path, inputs: CalibrationInputs) -> _Setting:
    base = tpath.parent
    src = str(tpath)
    cell = load_config(config_ref(tmpl.cell or "", "cells"), CellConfig, base)
    workload = load_config(config_ref(tmpl.workload or "", "workloads"), WorkloadConfig, base)
    protocol = load_config(config_ref(tmpl.protocol or "", "protocols"), ProtocolConfig, base)
    if inputs.stage_c.cell != cell.name:
        raise InputError(
            f"{inputs.files['stage-c'][0]}: cell: got {inputs.stage_c.cell!r}; expected the template's cell "
            f"{cell.name!r}"
        )
    rule = resolve_rule(tmpl.rule, tmpl.rule_overrides, base, src)
    return _Setting(tmpl.fill, base, src, cell, workload, protocol, rule)


def _references(inputs: CalibrationInputs, P: FillParams) -> _References:
    """1. references from E0a."""
    e0a_path = str(inputs.files["e0a"][0])
    ev = e0a_values(inputs.e0a, e0a_path, P.summary_tolerance)
    lam_ref = ev.lambda_ref
    if inputs.e0b.lambda_ref is not None and abs(inputs.e0b.lambda_ref - lam_ref) > P.lambda_ref_tolerance * lam_ref:
        raise InputError(
            f"{inputs.files['e0b'][0]}: lambda_ref: got {inputs.e0b.lambda_ref}; expected E0a's lambda_ref {lam_ref} "
            f"(within a relative {P.lambda_ref_tolerance}): the multiples must be of the registered unit"
        )
    lam_miss = lam_ref if P.lambda_miss == "lambda_ref" else ev.lambda_sessions
    reasons: list[str] = []
    if lam_miss is None:
        reasons.append("E0a gives no completed-session rate, which the template's lambda_miss = sessions needs")
    if ev.all_miss_token_rate is None:
        reasons.append("E0a gives no all-miss token rate: the TRAPPED rule cannot be judged without it")
    return _References(ev, lam_ref, lam_miss, reasons)


def _shape(inputs: CalibrationInputs, P: FillParams) -> _Shape:
    """2. curve and edge."""
    curve = inputs.stage_c.curve()
    cap = F.cap_rule(
        curve, fraction=P.cap_fraction, ambiguity=P.cap_ambiguity, ambiguity_fraction=P.cap_ambiguity_fraction
    )
    runs = {(p.multiple, p.seed): p.stable for p in inputs.e0b.points}
    edge = F.e0b_edge(inputs.e0b.grid, inputs.e0b.seeds, runs, P.e0b_edge)
    return _Shape(curve, cap, edge)


def _rates(tmpl: Template, P: FillParams, refs: _References, shape: _Shape) -> _Rates:
    """3.-4. window and rates."""
    lam_ref = refs.lam_ref
    w = F.window(shape.cap.mu_star, lam_ref, shape.edge.edge, low=P.window_low, upper=P.upper_edge)
    fractions = [(int(a), int(b)) for a, b in P.fractions]
    placed = F.place_rates(
        w,
        fractions=fractions,
        step=P.rate_step,
        rounding=P.rounding,
        band_low_factor=P.band_low_factor,
        band_high_factor=P.band_high_factor,
    )
    formula_status = "FILLED" if placed.ok else "INCOMPLETE"
    reasons = list(placed.reasons) + refs.reasons
    multiples = [float(r.multiple) for r in placed.rates]
    top_rate = tmpl.top_rate if tmpl.top_rate is not None else DEFAULT_TOP_RATE
    for m in multiples:
        above = rate_above_top(m, lam_ref, top_rate)
        if above:
            reasons.append(f"{above} (the template's top_rate {top_rate:g})")
    return _Rates(w, placed, multiples, top_rate, formula_status, reasons)


def _drains(setting: _Setting, refs: _References, shape: _Shape, rates: _Rates) -> _Drains:
    """5.-6. cap and drain."""
    P, protocol, lam_ref, cap = setting.params, setting.protocol, refs.lam_ref, shape.cap
    budget = F.drain_budget(
        protocol.duration,
        protocol.burst.time,
        float(setting.rule["params"]["recovered_span"]),  # every rule spec states it (analysis/rulecheck.py)
        P.drain_fraction,
    )
    b = protocol.burst.size
    drains = {
        m: F.drain(cap.mu_cap, cap.cap, m, lam_ref, b, budget, shape.curve, P.drain_formula) for m in rates.multiples
    }
    lam_max = F.largest_fitting_multiple(cap.mu_cap, lam_ref, b, budget)
    w = rates.window
    width = float(w.high - w.low) if w.high is not None else 0.0
    noise = F.window_noise(width, lam_ref, refs.values.lambda_ref_se, P.noise_factor)
    return _Drains(budget, b, drains, lam_max, width, noise)


def _warnings(
    refs: _References, shape: _Shape, drains: _Drains, gated: set[str], curve_end: tuple[int, float]
) -> list[dict[str, Any]]:
    """7. warnings (checks the formula reports without a threshold of its own)."""
    cap, edge, lam_miss = shape.cap, shape.edge, refs.lam_miss
    n_max, mu_nmax = curve_end
    warnings: list[dict[str, Any]] = []
    if lam_miss:
        warnings.append(
            {
                "id": "mu_nmax_vs_lambda_miss",
                "value": abs(mu_nmax / lam_miss - 1),
                "text": f"|mu({n_max}) / lambda_miss - 1| at the largest grid n (a check only, no threshold)",
            }
        )
    if cap.ambiguous:
        others = [n for n in cap.at_threshold if n != cap.cap]
        warnings.append(
            {
                "id": "cap_ambiguous",
                "value": None,
                "text": (
                    f"cap {cap.cap} is ambiguous ({cap.reading}): argmax {cap.argmax}; n at the threshold "
                    f"{list(cap.at_threshold)}" + (f", other n {others}" if others else "")
                ),
            }
        )
    for m, d in drains.per_rate.items():
        if not d.fits and gated:
            warnings.append(
                {
                    "id": f"drain_does_not_fit_{m}",
                    "value": _finite(d.drain_s),
                    "text": (
                        f"at {m} x lambda_ref the CAPPED drain does not fit {drains.budget:.0f} s: its prediction "
                        "lapses and kill condition K3 does not apply there"
                    ),
                }
            )
    if not edge.monotone:
        warnings.append(
            {
                "id": "e0b_not_monotone",
                "value": None,
                "text": f"a run above the first unstable multiple {edge.first_unstable} was stable",
            }
        )
    if not edge.complete:
        warnings.append(
            {
                "id": "e0b_partial",
                "value": None,
                "text": (
                    "E0b runs missing above the first unstable multiple (cannot change the edge): "
                    f"{[list(x) for x in edge.missing]}"
                ),
            }
        )
    if drains.noise["triggered"]:
        warnings.append(
            {
                "id": "window_noise",
                "value": drains.width,
                "text": "kill condition K4 holds at filling: the window is empty or narrower than the noise",
            }
        )
    return warnings


def _fill_trace(
    tpath: Path,
    root: Path | None,
    inputs: CalibrationInputs,
    P: FillParams,
    refs: _References,
    shape: _Shape,
    rates: _Rates,
    drains: _Drains,
    predictions: list[dict[str, Any]],
) -> dict[str, Any]:
    """The registration's `fill` trace: every measured value and every step's result."""
    lam_ref, cap, edge, w, placed = refs.lam_ref, shape.cap, shape.edge, rates.window, rates.placed
    return {
        "template": {"path": rel_path(tpath, root), "sha256": hashlib.sha256(tpath.read_bytes()).hexdigest()},
        "params": P.model_dump(mode="json"),
        "formula_status": rates.formula_status,
        "measured": {
            "mu": [{"n": n, "mu_sessions": m} for n, m in shape.curve],
            "mu_star": cap.mu_star,
            "n_star": cap.argmax,
            "mu_star_over_lambda_ref": cap.mu_star / lam_ref,
            "e0a_computed": list(refs.values.computed),
            "e0b": {
                "grid": list(inputs.e0b.grid),
                "seeds": list(inputs.e0b.seeds),
                "edge": edge.edge,
                "first_unstable": edge.first_unstable,
                "monotone": edge.monotone,
                "complete": edge.complete,
                "reading": edge.reading,
                "stability_rule": inputs.e0b.protocol.as_data(),
            },
        },
        "window": {
            "low": float(w.low),
            "high": _f(w.high),
            "binding": w.binding,
            "low_sessions_per_s": float(w.low) * lam_ref,
            "high_sessions_per_s": None if w.high is None else float(w.high) * lam_ref,
            "mu_star_over_lambda_ref": w.mu_star_ratio,
            "e0b_edge": w.e0b_edge,
        },
        "band": None
        if placed.band is None
        else {"low": float(placed.band[0]), "high": float(placed.band[1]), "strict": True},
        "rates": [
            {"fraction": list(r.fraction), "raw": float(r.raw), "rounded": float(r.multiple), "inside_band": r.inside}
            for r in placed.rates
        ],
        "cap": {
            "cap": cap.cap,
            "rule": f"smallest grid n with mu(n) >= {P.cap_fraction} mu*",
            "threshold": cap.threshold,
            "argmax": cap.argmax,
            "mu_cap": cap.mu_cap,
            "at_threshold": list(cap.at_threshold),
            "ambiguous": cap.ambiguous,
            "ambiguity_reading": cap.reading,
        },
        "drain": {
            "burst": drains.burst,
            "budget_s": drains.budget,
            "formula": P.drain_formula,
            "largest_fitting_multiple": drains.largest_fitting_multiple,
            "per_rate": [
                {
                    "rate": m,
                    "lambda": d.lam,
                    "crude_s": _finite(d.crude_s),
                    "refined_s": _finite(d.refined_s),
                    "n1": d.n1,
                    "drain_s": _finite(d.drain_s),
                    "fits": d.fits,
                }
                for m, d in drains.per_rate.items()
            ],
        },
        "boundaries": {
            "recovery_threshold_sessions_per_s": lam_ref,
            "recovery_threshold_note": (
                "lambda_ref, not mu at the largest grid n, which the synchronized start of Stage C biases upward"
            ),
            "below_window": "rates below lambda_ref: BURST not trapped (none registered)",
            "above_window": "no rate above the window is registered: NOBURST could leave the good state unaided",
        },
        "predictions": predictions,
    }


def _fill(tmpl: Template, tpath: Path, inputs: CalibrationInputs, root: Path | None) -> FillResult:
    """The registration by the module docstring's steps, each a function of what the earlier gave."""
    setting = _setting(tmpl, tpath, inputs)
    P, rule, protocol, workload = setting.params, setting.rule, setting.protocol, setting.workload
    refs = _references(inputs, P)  # 1.
    shape = _shape(inputs, P)  # 2.
    rates = _rates(tmpl, P, refs, shape)  # 3.-4.
    drains = _drains(setting, refs, shape, rates)  # 5.-6.
    # 7. warnings, kill conditions, predictions
    arms = list(tmpl.arms or [])
    arm_cfgs = arm_configs(arms, setting.base, shape.cap.cap, setting.src)
    gated = {a for a, c in arm_cfgs.items() if c.gate is not None}
    warnings = _warnings(refs, shape, drains, gated, shape.curve[-1])

    lam_ref, multiples, reasons = refs.lam_ref, rates.multiples, rates.reasons
    status = "FILLED" if not reasons else "INCOMPLETE"
    bound = status == "FILLED"
    plans = (
        plan_hashes(workload, protocol, arm_cfgs, multiples, lam_ref, list(tmpl.seeds or []), rates.top_rate)
        if bound
        else []
    )
    ev, lam_miss = refs.values, refs.lam_miss
    all_miss = ev.all_miss_token_rate
    references = {
        "lambda_ref": lam_ref,
        "lambda_ref_se": ev.lambda_ref_se,
        "lambda_miss": lam_miss if lam_miss is not None else lam_ref,
        "lambda_miss_sessions": ev.lambda_sessions,
        "all_miss_token_rate": all_miss,
        "all_miss_token_rate_se": ev.all_miss_token_rate_se,
    }
    inputs_list = [{"path": rel_path(p, root), "sha256": h, "role": stage} for stage, (p, h) in inputs.files.items()]
    design = bound_design(
        inputs.folder, tpath, inputs.files, root
    )  # a design record beside the inputs is bound by its hash
    if design is not None:
        inputs_list.append({"path": design["path"], "sha256": design["sha256"], "role": "design"})
    predictions = _predictions(arms, rule, multiples, drains.per_rate, gated) if multiples else []
    trace = _fill_trace(tpath, root, inputs, P, refs, shape, rates, drains, predictions)
    if design is not None:
        trace["design"] = design
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": tmpl.name,
        "description": tmpl.description.strip(),
        "status": status,
        "status_reasons": reasons,
        "parent": None,
        "test": tmpl.test,
        "cell": cell_dump(setting.cell, lam_ref, all_miss),
        "workload": workload.model_dump(mode="json"),
        "protocol": protocol.model_dump(mode="json"),
        "arms": arms,
        "arm_configs": {a: c.model_dump(mode="json") for a, c in arm_cfgs.items()},
        "rates": [{"multiple": m, "sessions_per_s": m * lam_ref} for m in multiples],
        "seeds": list(tmpl.seeds or []),
        "cap": shape.cap.cap if gated else None,
        "top_rate": rates.top_rate,
        "start_lateness_p99": tmpl.start_lateness_p99
        if tmpl.start_lateness_p99 is not None
        else DEFAULT_START_LATENESS_P99,
        "references": references,
        "rule": rule,
        "kill_conditions": _kill_conditions(arms, rule, drains.fits, drains.noise),
        "warnings": warnings,
        "allowances": tmpl.allowances.model_dump(mode="json"),
        "inputs": inputs_list,
        "plans": plans,
        "fill": trace,
    }
    return FillResult(registration_from_data(data, f"{setting.src} (filled)"), data)


def fill_to_file(
    inputs_dir: str | Path | None,
    template_path: str | Path,
    out: str | Path,
    *,
    repo_root: Path | None = None,
    name: str | None = None,
) -> tuple[str, FillResult]:
    """Fill and write; returns the SHA-256 of the bytes written."""
    res = fill_registration(inputs_dir, template_path, repo_root=repo_root, name=name)
    sha = write_registration(res.registration, out)
    return sha, res
