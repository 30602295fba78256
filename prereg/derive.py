"""Registrations filled from another registration rather than from calibration inputs.

Two ways (prereg/template.py): a template with a `parent` derives an EXPLORATORY registration from a
FILLED one (the parent's rates, cap and references with the template's changes: cell settings,
arms, seeds, rule overrides); a template with `based_on` fills a FILLED registration of another test
on a FILLED registration's calibration (its cell, references and cap, at some of its registered
rates), as the paper's BASIN, TOOLSLOW, SHED, rescue, CUT and MIRROR registrations reuse the E2
cells'. Both are pure functions of the bytes they read, like the formula's fill.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.config import CellConfig, ProtocolConfig, WorkloadConfig, config_ref, load_config
from prereg.filling import FillResult, arm_configs, cell_dump, plan_hashes, rel_path
from prereg.registration import (
    FORMAT,
    FORMAT_VERSION,
    Registration,
    RegistrationError,
    load_registration,
    registration_from_data,
)
from prereg.template import Template, resolve_rule


def derive_exploratory(tmpl: Template, tpath: Path, root: Path | None) -> FillResult:
    """An EXPLORATORY registration from a FILLED parent: the parent's rates, cap and references,
    with the template's changes (cell settings, arms, seeds, rule overrides)."""
    base = tpath.parent
    src = str(tpath)
    parent, ppath = _load_parent(tmpl.parent or "", base, root, src, "parent")
    cell_d = {**parent.cell.model_dump(mode="json"), **tmpl.cell_overrides}
    try:
        cell = CellConfig.model_validate(cell_d, strict=True)
    except Exception as exc:
        raise RegistrationError(
            f"{src}: cell_overrides: the parent's cell with these changes is not a valid cell: {exc}"
        ) from None
    arms = list(tmpl.arms) if tmpl.arms is not None else list(parent.arms)
    seeds = list(tmpl.seeds) if tmpl.seeds is not None else list(parent.seeds)
    arm_cfgs = {a: parent.arm_configs[a] for a in arms if a in parent.arm_configs}
    arm_cfgs.update(arm_configs([a for a in arms if a not in arm_cfgs], base, parent.cap, src))
    rule = (
        resolve_rule(tmpl.rule, tmpl.rule_overrides, base, src)
        if (tmpl.rule != "e2" or tmpl.rule_overrides)
        else parent.rule
    )
    lam_ref = parent.references.lambda_ref
    mults = parent.multiples()
    top_rate = tmpl.top_rate if tmpl.top_rate is not None else parent.top_rate
    data = parent.model_dump(mode="json")
    data.update(
        {
            "name": tmpl.name,
            "description": tmpl.description.strip(),
            "status": "EXPLORATORY",
            "status_reasons": [],
            "parent": {"name": parent.name, "path": rel_path(ppath, root), "sha256": parent.sha256},
            "test": tmpl.test,
            "cell": cell_dump(cell, lam_ref, parent.references.all_miss_token_rate),
            "arms": arms,
            "arm_configs": {a: c.model_dump(mode="json") for a, c in arm_cfgs.items()},
            "seeds": seeds,
            "rule": rule,
            "allowances": tmpl.allowances.model_dump(mode="json"),
            "kill_conditions": [],
            "warnings": [],  # an EXPLORATORY registration decides nothing; the parent holds both
            "inputs": [{"path": rel_path(ppath, root), "sha256": parent.sha256, "role": "parent"}],
            "top_rate": top_rate,
            "start_lateness_p99": tmpl.start_lateness_p99
            if tmpl.start_lateness_p99 is not None
            else parent.start_lateness_p99,
            "plans": plan_hashes(parent.workload, parent.protocol, arm_cfgs, mults, lam_ref, seeds, top_rate),
            "fill": {
                "template": {"path": rel_path(tpath, root), "sha256": hashlib.sha256(tpath.read_bytes()).hexdigest()},
                "derived_from": parent.name,
                "cell_overrides": dict(tmpl.cell_overrides),
                "note": "EXPLORATORY: derived from a FILLED parent; never decisive",
            },
        }
    )
    return FillResult(registration_from_data(data, f"{src} (derived)"), data)


def _load_parent(ref: str, base: Path, root: Path | None, src: str, key: str) -> tuple[Registration, Path]:
    p = Path(ref)
    if not p.is_absolute():
        p = (root / p) if root is not None and (root / p).is_file() else base / p
    reg = load_registration(p)
    if reg.status != "FILLED":
        raise RegistrationError(f"{src}: {key}: {p} has status {reg.status}; expected a FILLED registration")
    return reg, p


def fill_based_on(tmpl: Template, tpath: Path, root: Path | None) -> FillResult:
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
    workload = (
        load_config(config_ref(tmpl.workload, "workloads"), WorkloadConfig, base) if tmpl.workload else parent.workload
    )
    protocol = (
        load_config(config_ref(tmpl.protocol, "protocols"), ProtocolConfig, base) if tmpl.protocol else parent.protocol
    )
    rule = resolve_rule(tmpl.rule, tmpl.rule_overrides, base, src)
    arms = list(tmpl.arms or [])
    arm_cfgs = arm_configs(arms, base, parent.cap, src)
    lam_ref = parent.references.lambda_ref
    seeds = list(tmpl.seeds or [])
    top_rate = tmpl.top_rate if tmpl.top_rate is not None else parent.top_rate
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": tmpl.name,
        "description": tmpl.description.strip(),
        "status": "FILLED",
        "status_reasons": [],
        "parent": None,
        "test": tmpl.test,
        "cell": parent.cell.model_dump(mode="json"),
        "workload": workload.model_dump(mode="json"),
        "protocol": protocol.model_dump(mode="json"),
        "arms": arms,
        "arm_configs": {a: c.model_dump(mode="json") for a, c in arm_cfgs.items()},
        "rates": [{"multiple": m, "sessions_per_s": m * lam_ref} for m in rates],
        "seeds": seeds,
        "cap": parent.cap if any(c.gate is not None for c in arm_cfgs.values()) else None,
        "top_rate": top_rate,
        "start_lateness_p99": tmpl.start_lateness_p99
        if tmpl.start_lateness_p99 is not None
        else parent.start_lateness_p99,
        "references": parent.references.model_dump(mode="json"),
        "rule": rule,
        "kill_conditions": [],
        "warnings": [],
        "allowances": tmpl.allowances.model_dump(mode="json"),
        "inputs": [{"path": rel_path(ppath, root), "sha256": parent.sha256, "role": "parent"}]
        + [i.model_dump(mode="json") for i in parent.inputs],
        "plans": plan_hashes(workload, protocol, arm_cfgs, rates, lam_ref, seeds, top_rate),
        "fill": {
            "template": {"path": rel_path(tpath, root), "sha256": hashlib.sha256(tpath.read_bytes()).hexdigest()},
            "based_on": {"name": parent.name, "path": rel_path(ppath, root), "sha256": parent.sha256},
            "note": "the calibration (cell, references, cap) and the rates are the based_on registration's; "
            "the test's outcomes and refutation are its rule spec's",
        },
    }
    return FillResult(registration_from_data(data, f"{src} (based on {ppath.name})"), data)
