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

A template with a `parent` derives an EXPLORATORY registration from a FILLED one (no inputs).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config import DEFAULT_START_LATENESS_P99, ArmConfig, CellConfig, ConfigError, ProtocolConfig, WorkloadConfig, config_ref, load_config
from harness.workload.plans import DEFAULT_TOP_RATE, rate_above_top
from prereg import formula as F
from prereg.design_record import bound_design
from prereg.inputs import CalibrationInputs, InputError, e0a_values, load_inputs
from prereg.registration import (
    FORMAT,
    FORMAT_VERSION,
    Registration,
    RegistrationError,
    load_registration,
    registration_from_data,
    write_registration,
)
from prereg.template import FillParams, Template, load_template, resolve_rule


@dataclass(frozen=True)
class FillResult:
    registration: Registration
    data: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """What a person checks first: status, window, rates, cap, drains, warnings."""
        r = self.registration
        f = r.fill
        return {
            "name": r.name,
            "status": r.status,
            "status_reasons": r.status_reasons,
            "window": f.get("window"),
            "band": f.get("band"),
            "rates": [x.multiple for x in r.rates],
            "rates_sessions_per_s": [x.sessions_per_s for x in r.rates],
            "cap": f.get("cap"),
            "drain": f.get("drain"),
            "warnings": [w.model_dump() for w in r.warnings],
        }


def _rel(path: Path, root: Path | None) -> str:
    p = path.resolve()
    if root is not None:
        try:
            return p.relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def repo_root_of(path: Path) -> Path | None:
    """The git working tree holding `path`, for repository-relative paths (None outside one)."""
    try:
        from provenance.git import GitError, Repo

        return Repo.containing(path).path
    except (GitError, OSError):  # pragma: no cover - outside a repository
        return None


def _f(d: Any) -> float | None:
    return None if d is None else float(d)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _arm_configs(names: list[str], base: Path, cap: int | None, source: str) -> dict[str, ArmConfig]:
    out: dict[str, ArmConfig] = {}
    for name in names:
        arm = load_config(config_ref(name, "arms"), ArmConfig, base)
        try:
            arm.gate_cap(cap)
        except ConfigError as exc:
            raise RegistrationError(f"{source}: arms: {name}: {exc}") from None
        out[name] = arm
    return out


def plan_hashes(workload: WorkloadConfig, protocol: ProtocolConfig, arms: dict[str, ArmConfig], multiples: list[float],
                lambda_ref: float, seeds: list[int], top_rate: float = DEFAULT_TOP_RATE) -> list[dict[str, Any]]:  # fmt: skip
    """SHA-256 of every frozen plan (arm x rate x seed), generated exactly as a job generates it
    (from the base stream at the test's `top_rate`). Arms whose plan content is the same (BURST and
    CAPPED) share one generation."""
    import orjson

    from harness.workload.plans import make_plan, plan_arm, plan_bytes

    cache: dict[tuple[bytes, float, int], str] = {}
    out = []
    for name, arm in arms.items():
        key_arm = orjson.dumps(plan_arm(arm, protocol), option=orjson.OPT_SORT_KEYS)
        for m in multiples:
            for s in seeds:
                k = (key_arm, m, s)
                if k not in cache:
                    cache[k] = hashlib.sha256(plan_bytes(make_plan(workload, protocol, arm, m, lambda_ref, s, top_rate))).hexdigest()
                out.append({"arm": name, "rate": m, "seed": s, "sha256": cache[k]})
    return out


def _cell_dump(cell: CellConfig, lambda_ref: float, all_miss: float | None) -> dict[str, Any]:
    d = cell.model_dump(mode="json")
    d["cost_file"] = None  # costs inline: the registration must not change when a cost file does
    d["lambda_ref"] = lambda_ref
    d["all_miss_token_rate"] = all_miss
    return d


def _kill_conditions(arms: list[str], rule: dict[str, Any], fits: list[float], noise: dict[str, Any]) -> list[dict[str, Any]]:
    """The E2 registration's four kill conditions (App. E.11), as data for prereg.kill."""
    up = {a.upper() for a in arms} if isinstance(rule.get("arms"), dict) else set()
    out: list[dict[str, Any]] = []
    if "NOBURST" in up:
        out.append({"id": "K1", "kind": "arm_fails_fraction",
                    "description": "NOBURST not good in at least one third of the seeds at a registered rate",
                    "params": {"arm": "NOBURST", "fraction": [1, 3], "quantifier": "any"}, "frozen": None})  # fmt: skip
    if "BURST" in up:
        out.append({"id": "K2", "kind": "arm_fails_fraction",
                    "description": "BURST not trapped in two thirds of the seeds at every registered rate",
                    "params": {"arm": "BURST", "fraction": [2, 3], "quantifier": "every"}, "frozen": None})  # fmt: skip
    if "CAPPED" in up and "BURST" in up:
        out.append({"id": "K3", "kind": "capped_not_recovered",
                    "description": "CAPPED fails to recover in a seed whose BURST run is trapped, at a rate whose drain fits",
                    "params": {"burst_arm": "BURST", "capped_arm": "CAPPED", "rates": fits}, "frozen": None})  # fmt: skip
    out.append({"id": "K4", "kind": "window_noise",
                "description": "the window is empty or narrower than the noise (noise_factor x relative s.e. of lambda_ref)",
                "params": {}, "frozen": noise})  # fmt: skip
    return out


def _predictions(arms: list[str], rule: dict[str, Any], multiples: list[float], drains: dict[float, F.Drain], gated: set[str]) -> list[dict[str, Any]]:
    from analysis.rules import arm_expectation

    if not isinstance(rule.get("arms"), dict):
        return []  # a rule without per-arm states (a staged rule) carries its outcomes in its spec
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


def fill_registration(inputs_dir: str | Path | None, template_path: str | Path, *, repo_root: Path | None = None,
                      name: str | None = None) -> FillResult:  # fmt: skip
    """The registration the formula gives for these inputs and this template (not written).
    `name` replaces the template's registration name (one template, several cells' inputs)."""
    tpath = Path(template_path)
    tmpl = load_template(tpath)
    if name is not None:
        tmpl = tmpl.model_copy(update={"name": name})
    root = repo_root if repo_root is not None else repo_root_of(tpath)
    if tmpl.parent is not None:
        return _derive(tmpl, tpath, root)
    if tmpl.based_on is not None:
        return _based_on(tmpl, tpath, root)
    if inputs_dir is None:
        raise RegistrationError(f"{tpath}: this template fills from calibration inputs; give --inputs DIR")
    inputs = load_inputs(inputs_dir)
    return _fill(tmpl, tpath, inputs, root)


def _fill(tmpl: Template, tpath: Path, inputs: CalibrationInputs, root: Path | None) -> FillResult:
    P: FillParams = tmpl.fill
    base = tpath.parent
    src = str(tpath)
    cell = load_config(config_ref(tmpl.cell or "", "cells"), CellConfig, base)
    workload = load_config(config_ref(tmpl.workload or "", "workloads"), WorkloadConfig, base)
    protocol = load_config(config_ref(tmpl.protocol or "", "protocols"), ProtocolConfig, base)
    if inputs.stage_c.cell != cell.name:
        raise InputError(f"{inputs.files['stage-c'][0]}: cell: got {inputs.stage_c.cell!r}; expected the template's cell {cell.name!r}")
    rule = resolve_rule(tmpl.rule, tmpl.rule_overrides, base, src)

    # 1. references
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

    # 2. curve and edge
    curve = inputs.stage_c.curve()
    cap = F.cap_rule(curve, fraction=P.cap_fraction, ambiguity=P.cap_ambiguity, ambiguity_fraction=P.cap_ambiguity_fraction)
    runs = {(p.multiple, p.seed): p.stable for p in inputs.e0b.points}
    edge = F.e0b_edge(inputs.e0b.grid, inputs.e0b.seeds, runs, P.e0b_edge)

    # 3.-4. window and rates
    w = F.window(cap.mu_star, lam_ref, edge.edge, low=P.window_low, upper=P.upper_edge)
    fractions = [(int(a), int(b)) for a, b in P.fractions]
    placed = F.place_rates(w, fractions=fractions, step=P.rate_step, rounding=P.rounding,
                           band_low_factor=P.band_low_factor, band_high_factor=P.band_high_factor)  # fmt: skip
    formula_status = "FILLED" if placed.ok else "INCOMPLETE"
    reasons = list(placed.reasons) + reasons
    multiples = [float(r.multiple) for r in placed.rates]
    top_rate = tmpl.top_rate if tmpl.top_rate is not None else DEFAULT_TOP_RATE
    for m in multiples:
        above = rate_above_top(m, lam_ref, top_rate)
        if above:
            reasons.append(f"{above} (the template's top_rate {top_rate:g})")

    # 5.-6. cap and drain
    budget = F.drain_budget(protocol.duration, protocol.burst.time, float(rule["params"].get("recovered_span", protocol.recovered_span)), P.drain_fraction)
    b = protocol.burst.size
    drains = {m: F.drain(cap.mu_cap, cap.cap, m, lam_ref, b, budget, curve, P.drain_formula) for m in multiples}
    lam_max = F.largest_fitting_multiple(cap.mu_cap, lam_ref, b, budget)
    width = float(w.high - w.low) if w.high is not None else 0.0
    noise = F.window_noise(width, lam_ref, ev.lambda_ref_se, P.noise_factor)

    # 7. warnings, kill conditions, predictions
    arms = list(tmpl.arms or [])
    arm_cfgs = _arm_configs(arms, base, cap.cap, src)
    gated = {a for a, c in arm_cfgs.items() if c.gate is not None}
    n_max, mu_nmax = curve[-1]
    warnings: list[dict[str, Any]] = []
    if lam_miss:
        warnings.append({"id": "mu_nmax_vs_lambda_miss", "value": abs(mu_nmax / lam_miss - 1),
                         "text": f"|mu({n_max}) / lambda_miss - 1| at the largest grid n (a check only, no threshold)"})  # fmt: skip
    if cap.ambiguous:
        others = [n for n in cap.at_threshold if n != cap.cap]
        warnings.append({"id": "cap_ambiguous", "value": None,
                         "text": f"cap {cap.cap} is ambiguous ({cap.reading}): argmax {cap.argmax}; n at the threshold {list(cap.at_threshold)}"
                         + (f", other n {others}" if others else "")})  # fmt: skip
    for m, d in drains.items():
        if not d.fits and gated:
            warnings.append({"id": f"drain_does_not_fit_{m}", "value": _finite(d.drain_s),
                             "text": f"at {m} x lambda_ref the CAPPED drain does not fit {budget:.0f} s: its prediction lapses and kill condition K3 does not apply there"})  # fmt: skip
    if not edge.monotone:
        warnings.append({"id": "e0b_not_monotone", "value": None, "text": f"a run above the first unstable multiple {edge.first_unstable} was stable"})
    if not edge.complete:
        warnings.append({"id": "e0b_partial", "value": None,
                         "text": f"E0b runs missing above the first unstable multiple (cannot change the edge): {[list(x) for x in edge.missing]}"})  # fmt: skip
    if noise["triggered"]:
        warnings.append({"id": "window_noise", "value": width, "text": "kill condition K4 holds at filling: the window is empty or narrower than the noise"})
    fits = [m for m, d in drains.items() if d.fits]

    status = "FILLED" if not reasons else "INCOMPLETE"
    bound = status == "FILLED"
    plans = plan_hashes(workload, protocol, arm_cfgs, multiples, lam_ref, list(tmpl.seeds or []), top_rate) if bound else []
    all_miss = ev.all_miss_token_rate
    references = {
        "lambda_ref": lam_ref,
        "lambda_ref_se": ev.lambda_ref_se,
        "lambda_miss": lam_miss if lam_miss is not None else lam_ref,
        "lambda_miss_sessions": ev.lambda_sessions,
        "all_miss_token_rate": all_miss,
        "all_miss_token_rate_se": ev.all_miss_token_rate_se,
    }
    inputs_list = [{"path": _rel(p, root), "sha256": h, "role": stage} for stage, (p, h) in inputs.files.items()]
    design = bound_design(inputs.folder, tpath, inputs.files, root)  # a design record beside the inputs is bound by its hash
    if design is not None:
        inputs_list.append({"path": design["path"], "sha256": design["sha256"], "role": "design"})
    trace = {
        "template": {"path": _rel(tpath, root), "sha256": hashlib.sha256(tpath.read_bytes()).hexdigest()},
        "params": P.model_dump(mode="json"),
        "formula_status": formula_status,
        "measured": {
            "mu": [{"n": n, "mu_sessions": m} for n, m in curve],
            "mu_star": cap.mu_star,
            "n_star": cap.argmax,
            "mu_star_over_lambda_ref": cap.mu_star / lam_ref,
            "e0a_computed": list(ev.computed),
            "e0b": {"grid": list(inputs.e0b.grid), "seeds": list(inputs.e0b.seeds), "edge": edge.edge,
                    "first_unstable": edge.first_unstable, "monotone": edge.monotone, "complete": edge.complete,
                    "reading": edge.reading, "stability_rule": inputs.e0b.protocol.as_data()},  # fmt: skip
        },
        "window": {
            "low": float(w.low), "high": _f(w.high), "binding": w.binding,
            "low_sessions_per_s": float(w.low) * lam_ref,
            "high_sessions_per_s": None if w.high is None else float(w.high) * lam_ref,
            "mu_star_over_lambda_ref": w.mu_star_ratio, "e0b_edge": w.e0b_edge,
        },  # fmt: skip
        "band": None if placed.band is None else {"low": float(placed.band[0]), "high": float(placed.band[1]), "strict": True},
        "rates": [{"fraction": list(r.fraction), "raw": float(r.raw), "rounded": float(r.multiple), "inside_band": r.inside} for r in placed.rates],
        "cap": {"cap": cap.cap, "rule": f"smallest grid n with mu(n) >= {P.cap_fraction} mu*", "threshold": cap.threshold,
                "argmax": cap.argmax, "mu_cap": cap.mu_cap, "at_threshold": list(cap.at_threshold),
                "ambiguous": cap.ambiguous, "ambiguity_reading": cap.reading},  # fmt: skip
        "drain": {
            "burst": b, "budget_s": budget, "formula": P.drain_formula, "largest_fitting_multiple": lam_max,
            "per_rate": [{"rate": m, "lambda": d.lam, "crude_s": _finite(d.crude_s), "refined_s": _finite(d.refined_s),
                          "n1": d.n1, "drain_s": _finite(d.drain_s), "fits": d.fits} for m, d in drains.items()],
        },  # fmt: skip
        "boundaries": {
            "recovery_threshold_sessions_per_s": lam_ref,
            "recovery_threshold_note": "lambda_ref, not mu at the largest grid n, which the synchronized start of Stage C biases upward",
            "below_window": "rates below lambda_ref: BURST not trapped (none registered)",
            "above_window": "no rate above the window is registered: NOBURST could leave the good state unaided",
        },
        "predictions": _predictions(arms, rule, multiples, drains, gated) if multiples else [],
        **({"design": design} if design is not None else {}),
    }
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": tmpl.name,
        "description": tmpl.description.strip(),
        "status": status,
        "status_reasons": reasons,
        "parent": None,
        "test": tmpl.test,
        "cell": _cell_dump(cell, lam_ref, all_miss),
        "workload": workload.model_dump(mode="json"),
        "protocol": protocol.model_dump(mode="json"),
        "arms": arms,
        "arm_configs": {a: c.model_dump(mode="json") for a, c in arm_cfgs.items()},
        "rates": [{"multiple": m, "sessions_per_s": m * lam_ref} for m in multiples],
        "seeds": list(tmpl.seeds or []),
        "cap": cap.cap if gated else None,
        "top_rate": top_rate,
        "start_lateness_p99": tmpl.start_lateness_p99 if tmpl.start_lateness_p99 is not None else DEFAULT_START_LATENESS_P99,
        "references": references,
        "rule": rule,
        "kill_conditions": _kill_conditions(arms, rule, fits, noise),
        "warnings": warnings,
        "allowances": tmpl.allowances.model_dump(mode="json"),
        "inputs": inputs_list,
        "plans": plans,
        "fill": trace,
    }
    return FillResult(registration_from_data(data, f"{src} (filled)"), data)


def _derive(tmpl: Template, tpath: Path, root: Path | None) -> FillResult:
    """An EXPLORATORY registration from a FILLED parent: the parent's rates, cap and references,
    with the template's changes (cell settings, arms, seeds, rule overrides)."""
    base = tpath.parent
    src = str(tpath)
    parent, ppath = _load_parent(tmpl.parent or "", base, root, src, "parent")
    cell_d = {**parent.cell.model_dump(mode="json"), **tmpl.cell_overrides}
    try:
        cell = CellConfig.model_validate(cell_d, strict=True)
    except Exception as exc:
        raise RegistrationError(f"{src}: cell_overrides: the parent's cell with these changes is not a valid cell: {exc}") from None
    arms = list(tmpl.arms) if tmpl.arms is not None else list(parent.arms)
    seeds = list(tmpl.seeds) if tmpl.seeds is not None else list(parent.seeds)
    arm_cfgs = {a: parent.arm_configs[a] for a in arms if a in parent.arm_configs}
    arm_cfgs.update(_arm_configs([a for a in arms if a not in arm_cfgs], base, parent.cap, src))
    rule = resolve_rule(tmpl.rule, tmpl.rule_overrides, base, src) if (tmpl.rule != "e2" or tmpl.rule_overrides) else parent.rule
    lam_ref = parent.references.lambda_ref
    mults = parent.multiples()
    top_rate = tmpl.top_rate if tmpl.top_rate is not None else parent.top_rate
    data = parent.model_dump(mode="json")
    data.update({
        "name": tmpl.name, "description": tmpl.description.strip(), "status": "EXPLORATORY", "status_reasons": [],
        "parent": {"name": parent.name, "path": _rel(ppath, root), "sha256": parent.sha256},
        "test": tmpl.test, "cell": _cell_dump(cell, lam_ref, parent.references.all_miss_token_rate),
        "arms": arms, "arm_configs": {a: c.model_dump(mode="json") for a, c in arm_cfgs.items()}, "seeds": seeds, "rule": rule,
        "allowances": tmpl.allowances.model_dump(mode="json"),
        "kill_conditions": [], "warnings": [],  # an EXPLORATORY registration decides nothing; the parent holds both
        "inputs": [{"path": _rel(ppath, root), "sha256": parent.sha256, "role": "parent"}],
        "top_rate": top_rate, "start_lateness_p99": tmpl.start_lateness_p99 if tmpl.start_lateness_p99 is not None else parent.start_lateness_p99,
        "plans": plan_hashes(parent.workload, parent.protocol, arm_cfgs, mults, lam_ref, seeds, top_rate),
        "fill": {"template": {"path": _rel(tpath, root), "sha256": hashlib.sha256(tpath.read_bytes()).hexdigest()},
                 "derived_from": parent.name, "cell_overrides": dict(tmpl.cell_overrides),
                 "note": "EXPLORATORY: derived from a FILLED parent; never decisive"},
    })  # fmt: skip
    return FillResult(registration_from_data(data, f"{src} (derived)"), data)


def _load_parent(ref: str, base: Path, root: Path | None, src: str, key: str) -> tuple[Registration, Path]:
    p = Path(ref)
    if not p.is_absolute():
        p = (root / p) if root is not None and (root / p).is_file() else base / p
    reg = load_registration(p)
    if reg.status != "FILLED":
        raise RegistrationError(f"{src}: {key}: {p} has status {reg.status}; expected a FILLED registration")
    return reg, p


def _based_on(tmpl: Template, tpath: Path, root: Path | None) -> FillResult:
    """A FILLED registration of another test on a FILLED registration's calibration: its cell,
    references and cap, at some of its registered rates (the paper's BASIN, TOOLSLOW, SHED, rescue,
    CUT and MIRROR registrations reuse the E2 cells' this way), with the template's arms, seeds,
    rule and, where given, workload and protocol."""
    base = tpath.parent
    src = str(tpath)
    parent, ppath = _load_parent(tmpl.based_on or "", base, root, src, "based_on")
    rates = list(tmpl.rates or [])
    bad = [r for r in rates if not any(abs(r - m) < 1e-9 for m in parent.multiples())]
    if bad:
        raise RegistrationError(f"{src}: rates: got {bad}; expected rates registered by {ppath} ({parent.multiples()})")
    workload = load_config(config_ref(tmpl.workload, "workloads"), WorkloadConfig, base) if tmpl.workload else parent.workload
    protocol = load_config(config_ref(tmpl.protocol, "protocols"), ProtocolConfig, base) if tmpl.protocol else parent.protocol
    rule = resolve_rule(tmpl.rule, tmpl.rule_overrides, base, src)
    arms = list(tmpl.arms or [])
    arm_cfgs = _arm_configs(arms, base, parent.cap, src)
    lam_ref = parent.references.lambda_ref
    seeds = list(tmpl.seeds or [])
    top_rate = tmpl.top_rate if tmpl.top_rate is not None else parent.top_rate
    data = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "name": tmpl.name, "description": tmpl.description.strip(),
        "status": "FILLED", "status_reasons": [], "parent": None, "test": tmpl.test,
        "cell": parent.cell.model_dump(mode="json"), "workload": workload.model_dump(mode="json"), "protocol": protocol.model_dump(mode="json"),
        "arms": arms, "arm_configs": {a: c.model_dump(mode="json") for a, c in arm_cfgs.items()},
        "rates": [{"multiple": m, "sessions_per_s": m * lam_ref} for m in rates], "seeds": seeds,
        "cap": parent.cap if any(c.gate is not None for c in arm_cfgs.values()) else None,
        "top_rate": top_rate, "start_lateness_p99": tmpl.start_lateness_p99 if tmpl.start_lateness_p99 is not None else parent.start_lateness_p99,
        "references": parent.references.model_dump(mode="json"), "rule": rule, "kill_conditions": [], "warnings": [],
        "allowances": tmpl.allowances.model_dump(mode="json"),
        "inputs": [{"path": _rel(ppath, root), "sha256": parent.sha256, "role": "parent"}] + [i.model_dump(mode="json") for i in parent.inputs],
        "plans": plan_hashes(workload, protocol, arm_cfgs, rates, lam_ref, seeds, top_rate),
        "fill": {"template": {"path": _rel(tpath, root), "sha256": hashlib.sha256(tpath.read_bytes()).hexdigest()},
                 "based_on": {"name": parent.name, "path": _rel(ppath, root), "sha256": parent.sha256},
                 "note": "the calibration (cell, references, cap) and the rates are the based_on registration's; "
                         "the test's outcomes and refutation are its rule spec's"},
    }  # fmt: skip
    return FillResult(registration_from_data(data, f"{src} (based on {ppath.name})"), data)


def fill_to_file(inputs_dir: str | Path | None, template_path: str | Path, out: str | Path, *, repo_root: Path | None = None,
                 name: str | None = None) -> tuple[str, FillResult]:  # fmt: skip
    """Fill and write; returns the SHA-256 of the bytes written."""
    res = fill_registration(inputs_dir, template_path, repo_root=repo_root, name=name)
    sha = write_registration(res.registration, out)
    return sha, res
