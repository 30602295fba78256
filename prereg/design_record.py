"""The design record: what `agentload prereg design` found, as a file a registration binds.

Why a file: a design evaluation is only worth something if the registration can show it was made
before the runs and for exactly the template and calibration it registers. The record carries the
SHA-256 of the template and of each calibration input it was computed from, the cost model, the
settings (fresh seeds, k of n, margin), the evaluation of the template's own design (the table per
rate and arm), the proposal the search found and every candidate it simulated. It is written with
the registration's deterministic writer (no clock, no host), so the same inputs give the same bytes.

When the inputs folder holds design.yaml, `prereg fill` binds it (an input of role "design", by
SHA-256) after checking that it was made for this template and these inputs, and copies its
verdict into the fill trace (`fill.design`); prereg/decidable.py reads it from there.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config import load_yaml
from harness.config.files import dump_yaml
from prereg.registration import RegistrationError, sha256_file

if TYPE_CHECKING:  # the fill reads records without loading the simulator
    from prereg.design import Context, FormulaEval
    from prereg.design_search import Evaluated, SearchResult

DESIGN_FORMAT = "agentload-design"
DESIGN_FILE = "design.yaml"
FORMAT_VERSION = 1


def _rel(path: Path, root: Path | None) -> str:
    p = Path(path).resolve()
    if root is not None:
        try:
            return p.relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def formula_json(fe: FormulaEval, overhead_s: float) -> dict[str, Any]:
    p = fe.protocol
    return {
        "design": fe.design.to_json(),
        "protocol": None if p is None else p.model_dump(mode="json"),
        "rule_params": None if fe.rule is None else {k: fe.rule["params"][k] for k in sorted(fe.rule["params"])},
        "rates": fe.multiples,
        "cap": fe.cap,
        "mu_cap": fe.mu_cap,
        "drain_budget_s": fe.budget_s,
        "drains": fe.drains,
        "window_s": None if p is None else p.window.end - p.window.start,
        "min_window_s": None if fe.rule is None else fe.rule["params"].get("min_window"),
        "runs": fe.runs,
        "run_s": fe.run_s,
        "engine_hours": round(fe.engine_hours(overhead_s), 4),
        "ci_seconds": round(fe.ci_seconds(overhead_s), 1),
        "formula_reasons": fe.reasons,
    }


def evaluated_json(ev: Evaluated, overhead_s: float, margins: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out = formula_json(ev.formula, overhead_s)
    out["simulated"] = (
        None
        if ev.sim is None
        else {
            "counts": [c.to_json() for c in ev.sim.counts],
            "registered_seeds": [c.to_json() for c in ev.sim.registered],
            "runs": ev.sim.runs,
            "reason": ev.sim.reason,
        }
    )
    out["decisive"] = ev.decisive
    out["why_not"] = ev.why_not() or None
    if ev.over_limits:
        out["over_limits"] = ev.over_limits
    if margins is not None:
        out["flip_margins"] = margins
    return out


def design_record(
    ctx: Context,
    res: SearchResult,
    *,
    settings: dict[str, Any],
    overhead_s: float,
    root: Path | None,
    margins: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The record as plain data (written by `write_design`)."""
    base_undecidable = [r for r in res.baseline.formula.reasons if "can only FAIL" in r]
    return {
        "format": DESIGN_FORMAT,
        "format_version": FORMAT_VERSION,
        "name": ctx.template.name,
        "template": {"path": _rel(ctx.template_path, root), "sha256": sha256_file(ctx.template_path)},
        "inputs": [{"role": stage, "path": _rel(p, root), "sha256": h} for stage, (p, h) in ctx.inputs.files.items()],
        "cost": {
            "path": _rel(ctx.cost_path, root),
            "sha256": sha256_file(ctx.cost_path),
            "params": ctx.cell.cost.model_dump(mode="json"),
        },
        "references": {
            "lambda_ref": ctx.lambda_ref,
            "lambda_miss": ctx.lambda_miss,
            "all_miss_token_rate": ctx.all_miss,
            "note": "simulated runs are judged by the registered rule with these references, as a frozen prediction is",
        },
        "settings": settings,
        "decisive": res.baseline.decisive,
        "undecidable": base_undecidable,
        "baseline": evaluated_json(res.baseline, overhead_s, margins if res.proposal is res.baseline else None),
        "proposal": None if res.proposal is None else evaluated_json(res.proposal, overhead_s, margins),
        "search": {
            "candidates": res.candidates,
            "pruned_by_formula": res.pruned,
            "simulated": len(res.evaluated),
            "simulated_runs": res.sim_runs,
            "evaluated": [
                {
                    "design": e.formula.design.to_json(),
                    "engine_hours": round(e.formula.engine_hours(overhead_s), 4),
                    "decisive": e.decisive,
                    "why_not": e.why_not() or None,
                }
                for e in res.evaluated
            ],
        },
    }


def write_design(record: dict[str, Any], path: str | Path) -> str:
    data = dump_yaml(record)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def bound_design(
    folder: Path, template_path: Path, files: dict[str, tuple[Path, str]], root: Path | None
) -> dict[str, Any] | None:
    """The design record in an inputs folder, checked against the template and inputs being filled:
    {path, sha256, decisive, undecidable, proposal} for the fill trace, or None when there is none."""
    p = Path(folder) / DESIGN_FILE
    if not p.is_file():
        return None
    raw = p.read_bytes()
    data = load_yaml(p)
    if (
        not isinstance(data, dict)
        or data.get("format") != DESIGN_FORMAT
        or data.get("format_version") != FORMAT_VERSION
    ):
        raise RegistrationError(
            f"{p}: format: expected {DESIGN_FORMAT!r} version {FORMAT_VERSION} (a record of `agentload prereg design`)"
        )
    want = hashlib.sha256(template_path.read_bytes()).hexdigest()
    got = (data.get("template") or {}).get("sha256")
    if got != want:
        raise RegistrationError(
            f"{p}: template.sha256: got {got}; expected {want}, the SHA-256 of {template_path}: the design was made "
            "for another template; run `agentload prereg design` again"
        )
    have = {i.get("role"): i.get("sha256") for i in data.get("inputs") or []}
    for stage, (_, sha) in files.items():
        if have.get(stage) != sha:
            raise RegistrationError(
                f"{p}: inputs: the {stage} summary's SHA-256 is {sha}, the design was made from {have.get(stage)}; "
                "run `agentload prereg design` again"
            )
    prop = data.get("proposal") or {}
    return {
        "path": _rel(p, root),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "decisive": bool(data.get("decisive")),
        "undecidable": list(data.get("undecidable") or []),
        "why_not": (data.get("baseline") or {}).get("why_not"),
        "proposal": None if not prop else {"design": prop.get("design"), "engine_hours": prop.get("engine_hours")},
    }
