"""A test and every file it names, loaded and checked against each other.

`load_config` picks the model by the file's `kind:`; `load_test` resolves the cell, workload,
protocol and arms a test names and refuses, when the test loads, what would otherwise fail in every
run's worker once the runs had started (a rate above the base stream's top rate, a CUT that does not
thin, arms with the same name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from harness.config.files import M, config_ref, load_yaml, parse_config, resolve_path
from harness.config.models import ArmConfig, CellConfig, ProtocolConfig, TestConfig, WorkloadConfig, rate_above_top
from harness.errors import ConfigError

ConfigModel = WorkloadConfig | CellConfig | ProtocolConfig | ArmConfig | TestConfig

_KINDS: dict[str, type[BaseModel]] = {
    "workload": WorkloadConfig,
    "cell": CellConfig,
    "protocol": ProtocolConfig,
    "arm": ArmConfig,
    "test": TestConfig,
}


def _rule_file(rule: str, base: Path | None) -> Path | None:
    """The rule spec file a test names under configs/rules (or by path); None for a rule the
    analysis ships by name (analysis/rulespecs, loaded by `analysis.rules.load_rule`)."""
    if rule == "e2":
        return None
    try:
        return resolve_path(config_ref(rule, "rules"), base)
    except ConfigError:
        return None


def load_config(path: Path | str, model: type[M] | None = None, base: Path | None = None) -> M:
    """Load and validate one config file. The `kind:` key selects the model when none is given."""
    resolved = resolve_path(path, base)
    data = load_yaml(resolved)
    if model is None:
        if not isinstance(data, dict) or "kind" not in data:
            raise ConfigError(f"{resolved}: missing 'kind' (one of {sorted(_KINDS)})")
        kind = data["kind"]
        if kind not in _KINDS:
            raise ConfigError(f"{resolved}: kind: got {kind!r}; expected one of {sorted(_KINDS)}")
        model = _KINDS[kind]  # type: ignore[assignment]
    return parse_config(data, model, resolved)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TestBundle:
    """A test with every file it names loaded and checked against the others."""

    __test__ = False

    test: TestConfig
    cell: CellConfig
    workload: WorkloadConfig
    protocol: ProtocolConfig
    arms: dict[str, ArmConfig]  # keyed by each arm's own name (`name:` in its file)
    path: Path | None = None
    arm_refs: dict[str, str] | None = None  # arm name -> the reference the test gave (a name or a file)
    rule_path: Path | None = None  # the rule spec file the test names; None: the built-in E2 rule


def load_test(path: Path | str) -> TestBundle:
    """Load a test file and the cell, workload, protocol and arms it names (arms/<name>.yaml)."""
    resolved = resolve_path(path)
    test = load_config(resolved, TestConfig)
    base = resolved.parent
    cell = load_config(config_ref(test.cell, "cells"), CellConfig, base)
    workload = load_config(config_ref(test.workload, "workloads"), WorkloadConfig, base)
    protocol = load_config(config_ref(test.protocol, "protocols"), ProtocolConfig, base)
    arms: dict[str, ArmConfig] = {}
    refs: dict[str, str] = {}
    for i, ref in enumerate(test.arms):
        arm = load_config(config_ref(ref, "arms"), ArmConfig, base)
        try:
            arm.gate_cap(test.cap)
        except ConfigError as exc:
            raise ConfigError(f"{resolved}: cap: {exc}") from None
        # An arm is recorded and judged by its own name, whether the test names it or gives its file.
        if arm.name in arms:
            raise ConfigError(
                f"{resolved}: arms[{i}]: {ref!r} is an arm named {arm.name!r}, like {refs[arm.name]!r}; "
                "expected arms with distinct names"
            )
        arms[arm.name] = arm
        refs[arm.name] = ref
    _check_top_rate(resolved, test, cell, arms)
    rule_path = _rule_file(test.rule, base)
    return TestBundle(
        test=test,
        cell=cell,
        workload=workload,
        protocol=protocol,
        arms=arms,
        path=resolved,
        arm_refs=refs,
        rule_path=rule_path,
    )


def _check_top_rate(path: Path, test: TestConfig, cell: CellConfig, arms: dict[str, ArmConfig]) -> None:
    """Every rate the test will plan must fit under its base stream's top rate, and every CUT arm
    must thin (its rate at most each of the test's rates): refused here, when the test loads, rather
    than in each run's worker once the runs have started."""
    for name, a in arms.items():
        if a.cut is not None and a.cut.rate > min(test.rates):
            raise ConfigError(
                f"{path}: arm {name!r}: cut.rate {a.cut.rate:g} x lambda_ref is above the test's rate "
                f"{min(test.rates):g}; expected at most every rate of the test (a cut thins the base stream)"
            )
    if cell.lambda_ref is None:
        return  # no plan can be made without lambda_ref; the runner says so before any run starts
    for i, r in enumerate(test.rates):
        problem = rate_above_top(r, cell.lambda_ref, test.top_rate)
        if problem:
            raise ConfigError(
                f"{path}: rates[{i}]: {problem} (cell {cell.name!r}; top_rate {test.top_rate:g} in the test)"
            )
