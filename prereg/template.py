"""Registration templates: which test a registration is for, and the fill's named parameters.

A template names the cell, workload, protocol, arms, seeds and rule of a test family, and fixes
every reading of the formula that the paper leaves open as a parameter with a default (rules
digest, Decisions table). The fill copies the resolved parameters into the registration, so a
registration always says which reading it used. A template with a `parent` derives an EXPLORATORY
registration from a FILLED one instead (the paper's grid cells). Documented in docs/registration.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from analysis.rules import load_rule
from harness.config import DEFAULT_START_LATENESS_P99, DEFAULT_TOP_RATE, StrictModel, load_yaml, parse_config
from harness.errors import ConfigError, RuleError
from prereg.registration import Allowances, RegistrationError

TEMPLATE_FORMAT = "agentload-registration-template"


_Strict = StrictModel  # unknown keys refused, frozen, finite floats (harness/config/finite.py)


class FillParams(_Strict):
    """The formula's parameters; defaults are the paper's registrations (Decisions table)."""

    window_low: float = Field(
        1.0, gt=0, description="lower window end, x lambda_ref (mu_inf ~ lambda_miss ~ lambda_ref)"
    )
    upper_edge: Literal["min", "e0b"] = Field("min", description="min(mu*/lambda_ref, E0b edge), or the E0b edge alone")
    fractions: list[list[int]] = Field(default_factory=lambda: [[1, 3], [2, 3]], min_length=1)
    rate_step: float = Field(0.05, gt=0)
    rounding: Literal["half_up", "half_even"] = "half_up"
    band_low_factor: float = Field(1.1, gt=0)
    band_high_factor: float = Field(0.9, gt=0)
    cap_fraction: float = Field(0.95, gt=0, le=1)
    cap_ambiguity: Literal["another_at_threshold", "within_fraction_of_cap", "not_argmax_or_another"] = (
        "another_at_threshold"
    )
    cap_ambiguity_fraction: float = Field(0.05, ge=0)
    e0b_edge: Literal["prefix", "largest_all_stable"] = "prefix"
    drain_fraction: float = Field(0.8, gt=0, le=1)
    drain_formula: Literal["crude", "refined"] = "crude"
    noise_factor: float = Field(2.0, ge=0)
    lambda_miss: Literal["lambda_ref", "sessions"] = Field(
        "lambda_ref", description="what the rule uses as lambda_miss"
    )
    summary_tolerance: float = Field(0.005, ge=0, description="E0a summaries vs. the mean of their rows (relative)")
    lambda_ref_tolerance: float = Field(0.005, ge=0, description="E0b's unit vs. E0a's lambda_ref (relative)")

    @model_validator(mode="after")
    def _fractions(self) -> FillParams:
        for i, f in enumerate(self.fractions):
            if len(f) != 2 or f[1] <= 0 or not (0 < f[0] < f[1]):
                raise ValueError(f"fill.fractions[{i}] to be [num, den] with 0 < num < den, got {f}")
        return self


class Template(_Strict):
    format: Literal["agentload-registration-template"]
    format_version: Literal[1]
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    test: str = Field(..., min_length=1)
    description: str = ""
    cell: str | None = None
    workload: str | None = None
    protocol: str | None = None
    arms: list[str] | None = None
    seeds: list[int] | None = None
    rule: str | dict[str, Any] = "e2"
    rule_overrides: dict[str, Any] = Field(default_factory=dict)
    parent: str | None = Field(None, description="a FILLED registration this EXPLORATORY one derives from")
    based_on: str | None = Field(
        None, description="a FILLED registration whose calibration (cell, references, cap) this FILLED one reuses"
    )
    rates: list[float] | None = Field(
        None, description="with based_on: the registered rates (multiples) of the parent this test runs at"
    )
    cell_overrides: dict[str, Any] = Field(default_factory=dict)
    top_rate: float | None = Field(
        None,
        gt=0,
        description=f"the test's top_rate: sessions/s of the base stream every plan is thinned from "
        f"(default {DEFAULT_TOP_RATE:g}, or the based-on/parent registration's)",
    )
    start_lateness_p99: float | None = Field(
        None,
        gt=0,
        description=f"the test's open-loop bound on the p99 session-start lateness, plan seconds "
        f"(default {DEFAULT_START_LATENESS_P99:g}, or the based-on/parent registration's)",
    )
    allowances: Allowances = Allowances()
    fill: FillParams = FillParams()

    @model_validator(mode="after")
    def _complete(self) -> Template:
        if self.parent is not None and self.based_on is not None:
            raise ValueError(
                "parent or based_on, not both (EXPLORATORY derivation, or a FILLED test on another registration's "
                "calibration)"
            )
        if self.based_on is not None:
            missing = [k for k in ("arms", "seeds", "rates") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"{', '.join(missing)} given (a based_on template names its arms, seeds and rates)")
            if self.cell is not None or self.cell_overrides:
                raise ValueError(
                    "no cell or cell_overrides with based_on (the calibration is of the based_on registration's cell)"
                )
            return self
        if self.rates is not None:
            raise ValueError("rates only with based_on (otherwise the formula places them)")
        if self.parent is None:
            missing = [k for k in ("cell", "workload", "protocol", "arms", "seeds") if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)} given (a template without a parent names its cell, workload, protocol, arms "
                    "and seeds)"
                )
            if self.cell_overrides:
                raise ValueError(
                    "cell_overrides only with a parent (a template with its own cell edits the cell config instead)"
                )
        return self


def load_template(path: str | Path) -> Template:
    p = Path(path)
    if not p.is_file():
        raise RegistrationError(f"{p}: template not found")
    data = load_yaml(p)
    if isinstance(data, dict) and data.get("format") != TEMPLATE_FORMAT:
        raise RegistrationError(f"{p}: format: got {data.get('format')!r}; expected {TEMPLATE_FORMAT!r}")
    try:
        return parse_config(data, Template, p)
    except ConfigError as exc:
        raise RegistrationError(str(exc)) from None


def resolve_rule(
    ref: str | dict[str, Any], overrides: dict[str, Any], base: Path | None, source: str
) -> dict[str, Any]:
    """The rule spec a template names, through analysis.rules.load_rule (the rules' one loader).

    'e2' is the registered E2 rule; a path is a spec file; any other name is passed to load_rule
    as it is, for the rule names the rules module defines."""
    try:
        if isinstance(ref, dict):
            return load_rule(ref, overrides or None)
        if ref == "e2":
            return load_rule(None, overrides or None)
        for cand in ([base / ref] if base else []) + [Path(ref)]:
            if cand.is_file():
                return load_rule(cand, overrides or None)
        return load_rule(ref, overrides or None)
    except (RuleError, OSError, KeyError, TypeError, ValueError) as exc:
        raise RegistrationError(
            f"{source}: rule: got {ref!r}; expected a rule name or spec that analysis.rules.load_rule accepts ({exc})"
        ) from None
