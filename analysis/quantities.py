"""The names every judged run has, by where they come from.

analysis/staged_analysis.py builds a run's quantities under these names, and analysis/rulecheck.py
resolves every name a rule spec's expressions read against them (plus the spec's own parameters,
measures, derived quantities and labels), so a spec that reads a parameter it does not define is
refused when it is loaded, naming the field, instead of failing (or reading NaN) in some run.
"""

from __future__ import annotations

# The keys of analysis.metrics.run_statistics, in its order (tests/unit/analysis/test_rules_e2.py checks
# they agree): the names a rule spec may read of every run's window. They are defined here, not beside
# run_statistics, so that checking a spec (analysis/rulecheck.py) reads them without importing numpy and
# pandas: `status` and every registration load check specs, and neither computes a statistic.
WINDOW_STATISTICS = (
    "window_start",
    "window_end",
    "window_len",
    "hit",
    "followup_hit",
    "token_rate",
    "backlog_mean",
    "backlog_end",
    "slope",
    "hit_last",
    "outstanding_last",
    "outstanding_end",
    "sessions_completed_rate",
    "turns_completed_rate",
    "base_arrivals_window",
    "base_arrival_rate_window",
    "sessions",
    "refused",
    "failed_sessions",
    "failed_turns",
    "gate_waited",
    "gate_mean_wait",
    "gate_last_held",
)

# The references: nominal arrival rate, lambda_miss (= the cell's lambda_ref), the E0a all-miss
# token rate, the rate multiple and lambda_ref itself.
REFERENCES = ("lam", "lam_miss", "all_miss_rate", "rate", "lambda_ref")
# Window statistics over the references (the E2 table's columns).
RATIOS = ("token_ratio", "slope_threshold", "completions_ref", "base_arrivals_ref")
# What decides whether a run counts (a spec's `run.count_if`).
RUN_FACTS = ("run.completed", "run.plan_ok", "run.cell_ok", "run.bound", "run.cell")
OTHER = ("duration", "wall_s", "cap", "arm_key")
# The engine speed pin (harness/servers/speedpin.py, a CPU cell's `engine_speed_pin`): the probe's
# token rate over the cell's target when the pin settled before the run, and in the recheck after it
# (the same probe at the same quota, once the engine is idle). NaN where the cell has no pin, the
# server was not pinned (an attached one), or the recheck did not probe (an engine still busy):
# a rule's `run.count_if` can require the speed to have held to the end, e.g. within the band its
# TRAPPED state allows the token rate (the SGLang CPU rule, configs/rules/e2-cpu-sglang-16k.yaml).
SPEED_PIN = ("pin_start", "pin_after")
# The arm's perturbation and the protocol (flattened: arm.gate.t_on, protocol.burst.time) and the
# frozen predictions (pred.slope): names under these may be absent and read as NaN.
PREFIXES = ("arm.", "protocol.", "pred.")

RUN_QUANTITIES = frozenset((*REFERENCES, *WINDOW_STATISTICS, *RATIOS, *RUN_FACTS, *OTHER, *SPEED_PIN))
# What the seed stage reads of each role's run beside its quantities (analysis.stages.StagedRun.env).
RUN_ENV = ("status", "counted", "arm", "rate", "seed")
GROUP_BASE = ("rate", "n_seeds", "n_decided", "n_undecided")
TEST_BASE = ("n_groups", "n_runs")

# The metrics a spec's measure may name (analysis/measures.py `MEASURES`, their estimators), each
# with every argument a measure must give it, and the arguments that are literal words, not
# numbers. Here, beside the other names, so that checking a spec (analysis/rulecheck.py, on every
# registration load, `status` included) does not import the estimators and their numpy and pandas.
METRIC_ARGS: dict[str, tuple[str, ...]] = {
    "followup_hit": ("start", "end"),
    "hit": ("start", "end"),
    "completions": ("start", "end", "unit"),
    "token_rate": ("start", "end"),
    "backlog_slope": ("start", "end", "width"),
    "backlog_mean": ("start", "end"),
    "in_system_at": ("at",),
    "outstanding_at": ("at", "paused"),
    "outstanding_mean": ("start", "end", "paused"),
    "mean_prompt": ("start", "end"),
    "gap_slope": ("start", "end", "width"),
    "wave": ("kind",),
    "plan_arrival_rate": ("start", "end", "kind", "unit"),
    "tiled_followup": ("start", "end", "width"),
    "persistence": ("trigger_end", "stop", "width", "step", "onset_max", "escape_min"),
    "trigger": ("kind",),
    "gate": (),
    "e0b": ("final_bin", "rise_span"),
}
LITERAL_ARGS = ("kind", "unit")
