"""The names every judged run has, by where they come from.

analysis/staged_analysis.py builds a run's quantities under these names, and analysis/rulecheck.py
resolves every name a rule spec's expressions read against them (plus the spec's own parameters,
measures, derived quantities and labels), so a spec that reads a parameter it does not define is
refused when it is loaded, naming the field, instead of failing (or reading NaN) in some run.
"""

from __future__ import annotations

from analysis.metrics import WINDOW_STATISTICS

# The references: nominal arrival rate, lambda_miss (= the cell's lambda_ref), the E0a all-miss
# token rate, the rate multiple and lambda_ref itself.
REFERENCES = ("lam", "lam_miss", "all_miss_rate", "rate", "lambda_ref")
# Window statistics over the references (the E2 table's columns).
RATIOS = ("token_ratio", "slope_threshold", "completions_ref", "base_arrivals_ref")
# What decides whether a run counts (a spec's `run.count_if`).
RUN_FACTS = ("run.completed", "run.plan_ok", "run.cell_ok", "run.bound", "run.cell")
OTHER = ("duration", "wall_s", "cap", "arm_key")
# The arm's perturbation and the protocol (flattened: arm.gate.t_on, protocol.burst.time) and the
# frozen predictions (pred.slope): names under these may be absent and read as NaN.
PREFIXES = ("arm.", "protocol.", "pred.")

RUN_QUANTITIES = frozenset((*REFERENCES, *WINDOW_STATISTICS, *RATIOS, *RUN_FACTS, *OTHER))
# What the seed stage reads of each role's run beside its quantities (analysis.stages.StagedRun.env).
RUN_ENV = ("status", "counted", "arm", "rate", "seed")
GROUP_BASE = ("rate", "n_seeds", "n_decided", "n_undecided")
TEST_BASE = ("n_groups", "n_runs")
