"""Makers of prediction files, one per kind of predictor the paper froze, and what they share (this
module: the test a file is about, its rule, its registration, the predictor block).

- `simulator_predictions` (prereg/predict_sim.py): the reference engine model in virtual time, run on N fresh
  seeds (seeds the test does not use, so nothing about the registered runs is seen). Per registered run it
  predicts the probability of each rule state, of STUCK and of the arm's condition, and the mean of
  chosen statistics with a tolerance of `tolerance_sd` seed standard deviations (never below a
  floor); per seed, the probability that every arm meets its condition (estimated jointly, since
  the arms of a seed share a plan); per rate, the rule probability of PASS from those per-seed
  probabilities. Optionally (layer "exact") the simulator is also run on the registered seeds' own
  frozen plans and its per-run calls are frozen, as the paper's calibrated simulator did.
- `model_f_predictions` (prereg/predict_theory.py): model F driven by each registered seed's exact frozen plan (the
  plan-driven FIFO fluid): backlog slope over the window (and the quasi-static λ_plan − λ_miss as a
  comparator), completions, sessions present at the end, and a stuck call by the onset criterion.
- `entry_predictions` (prereg/predict_theory.py): the first-principles entry model: μ(n) on a grid, the 0.5-hit
  crossing, the all-miss onset n_b, the peak ratio μ*/λ_ref (the window's upper end from the curve's side)
  and μ_b/λ_ref (its lower end).

Every tolerance is a named parameter with the paper's value as its default where the paper states
one (crossing ±3 sessions, completions 0.006 /s); the file records which parameters were used.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from analysis.rules import load_rule
from harness.config import TestBundle, load_test
from harness.config.files import safe_load
from harness.errors import ConfigError
from prereg.registration import load_registration
from provenance.meta import git_state, sha256_file
from runs.arms import find_arm

DEFAULT_VALUE_QUANTITIES = ("hit", "followup_hit", "slope", "token_ratio")
# Floors under the seed-spread tolerance, per quantity (units of the quantity).
DEFAULT_TOLERANCE_FLOOR = {
    "hit": 0.01,
    "followup_hit": 0.01,
    "slope": 0.002,
    "token_ratio": 0.03,
    "completions_ref": 0.05,
    "backlog_end": 5.0,
}


def is_registration_file(path: str | Path) -> bool:
    """Does `path` hold a registration (format agentload-registration) rather than a test config?"""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        doc = safe_load(p.read_bytes())
    except yaml.YAMLError:
        return False
    return isinstance(doc, dict) and doc.get("format") == "agentload-registration"


def load_bundle(path: str | Path) -> TestBundle:
    """The test the predictions are about: a test config, or a registration file read as its
    registered test (`Registration.bundle()`: the registered cell with the references the
    calibration gave, the registered arms, rates and seeds). Predictions made after a fill are
    about the registered rates and plans, which a test config written before calibration cannot
    name."""
    if is_registration_file(path):
        return load_registration(path).bundle()
    return load_test(path)


def rule_of(test_path: str | Path, bundle: TestBundle) -> dict[str, Any]:
    """The rule the predictions are judged by: a registration's own rule, else the test's."""
    if is_registration_file(test_path):
        return dict(load_registration(test_path).rule)
    return load_rule(bundle.rule_path)


def registration_ref(path: str | Path | None) -> dict[str, Any] | None:
    """{name, path, sha256} of a registration file (its identity is the SHA-256 of its bytes)."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: registration file not found")

    doc = safe_load(p.read_bytes()) or {}
    return {
        "name": doc.get("name", p.stem) if isinstance(doc, dict) else p.stem,
        "path": str(path),
        "sha256": sha256_file(p),
    }


def predictor(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    g = git_state()
    return {
        "kind": kind,
        "code_commit": g["commit"],
        "dirty": g["dirty"],
        "command": list(sys.argv),
        "params": dict(params),
    }


def chosen_arms(bundle: TestBundle, arms: Sequence[str] | None) -> list[str]:
    """The test's arm keys the user named (by name or reference, any case), else all of them."""
    return [find_arm(bundle, a)[0] for a in arms] if arms else list(bundle.arms)
