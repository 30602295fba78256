"""Typed, strictly validated configuration: workload, cell, protocol, arm, test (the bottom layer).

Every experiment is a composition of these five files. Validation is strict (unknown keys are
errors) because a silently ignored key in a registered test is a protocol deviation nobody sees;
errors name the file, the field path, the bad value and what was expected.

`models.py` holds the models, `cost.py` the iteration-cost law a cell's `cost` parameters mean,
`files.py` the strict YAML reader and validation, `finite.py` the refusal of inf and NaN every
input format shares, `bundle.py` a test with every file it names. The
names below are the package's public face, so callers need not know which file holds what.
"""

from harness.config.bundle import ConfigModel, TestBundle, load_config, load_test
from harness.config.cost import CostModel, causal_pairs
from harness.config.files import CONFIG_ROOT, config_ref, load_yaml, parse_config, resolve_path
from harness.config.finite import StrictModel, check_finite, nonfinite_fields
from harness.config.models import (
    DEFAULT_START_LATENESS_P99,
    DEFAULT_TOP_RATE,
    ArmConfig,
    BurstSpec,
    CellConfig,
    CostConfig,
    Cut,
    EngineId,
    Gate,
    ProtocolConfig,
    Shed,
    SpeedPin,
    TestConfig,
    TestReferences,
    TokenRange,
    ToolSlow,
    ToolTimeLaw,
    TurnLaw,
    WindowSpec,
    WorkloadConfig,
    cost_file_owner,
    load_cost_file,
    rate_above_top,
)
from harness.errors import ConfigError

__all__ = [
    "CONFIG_ROOT",
    "DEFAULT_START_LATENESS_P99",
    "DEFAULT_TOP_RATE",
    "ArmConfig",
    "BurstSpec",
    "CellConfig",
    "ConfigError",
    "ConfigModel",
    "CostConfig",
    "CostModel",
    "Cut",
    "EngineId",
    "Gate",
    "ProtocolConfig",
    "Shed",
    "SpeedPin",
    "StrictModel",
    "TestBundle",
    "TestConfig",
    "TestReferences",
    "TokenRange",
    "ToolSlow",
    "ToolTimeLaw",
    "TurnLaw",
    "WindowSpec",
    "WorkloadConfig",
    "causal_pairs",
    "check_finite",
    "config_ref",
    "cost_file_owner",
    "load_config",
    "load_cost_file",
    "load_test",
    "load_yaml",
    "nonfinite_fields",
    "parse_config",
    "rate_above_top",
    "resolve_path",
]
