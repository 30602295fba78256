"""Kill conditions judged on per-seed states (App. E.11), including the paper's E2 outcome."""

from __future__ import annotations

from typing import Any

from support.paths import REPO

from analysis.kill import evaluate_kill_conditions
from analysis.rules import arm_expectation, load_rule
from prereg.registration import load_registration

ROOT = REPO
LETTER = {
    "T": "TRAPPED",
    "I": "INDETERMINATE",
    "D": "DRAINING",
    "G": "RECOVERED",
    "R": "RECOVERED",
    "-": "MISSING",
    "X": "NOT-COUNTED",
}


def _verdict(table: dict[float, dict[str, str]]) -> dict[str, Any]:
    """{rate: {arm: 'TIT'}} -> the paired verdict layout (analysis/paired.py): per rate each seed's
    states, and each run with whether it met the E2 rule's expectation for its arm."""
    e2 = load_rule("e2")
    rates, runs = [], []
    for rate, arms in table.items():
        seeds = {str(s): {arm: LETTER[states[s]] for arm, states in arms.items()} for s in range(3)}
        rates.append({"rate": rate, "seeds": seeds})
        for arm, states in arms.items():
            for s in range(3):
                st = LETTER[states[s]]
                if st != "MISSING":
                    runs.append(
                        {"arm": arm, "rate": rate, "seed": s, "state": st, "good": st in arm_expectation(e2, arm)}
                    )
    return {"rates": rates, "runs": runs}


def _kill(table: dict[float, dict[str, str]]) -> dict[str, Any]:
    reg = load_registration(ROOT / "prereg" / "registrations" / "e2-sglang-a100-300k.yaml")
    out = evaluate_kill_conditions(
        [k.model_dump() for k in reg.kill_conditions], _verdict(table), [1.35, 1.65], [0, 1, 2]
    )
    return {k["id"]: k["triggered"] for k in out}


def test_the_papers_e2_outcome_triggers_none() -> None:
    # Table 7: 1.35 BURST T I T, 1.65 T T T; NOBURST G G G and CAPPED R R R at both rates
    k = _kill(
        {
            1.35: {"burst": "TIT", "noburst": "GGG", "capped": "RRR"},
            1.65: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    assert k == {"K1": False, "K2": False, "K3": False, "K4": False}


def test_noburst_bad_in_a_third_of_seeds_at_one_rate() -> None:
    k = _kill(
        {
            1.35: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
            1.65: {"burst": "TTT", "noburst": "GIG", "capped": "RRR"},
        }
    )
    assert k["K1"] is True and k["K2"] is False


def test_burst_untrapped_needs_every_rate() -> None:
    one = _kill(
        {
            1.35: {"burst": "IDT", "noburst": "GGG", "capped": "RRR"},
            1.65: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    both = _kill(
        {
            1.35: {"burst": "IDT", "noburst": "GGG", "capped": "RRR"},
            1.65: {"burst": "DIT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    assert one["K2"] is False and both["K2"] is True


def test_capped_must_recover_where_burst_traps() -> None:
    k = _kill(
        {
            1.35: {"burst": "TTT", "noburst": "GGG", "capped": "RIR"},
            1.65: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    assert k["K3"] is True
    k = _kill(
        {
            1.35: {"burst": "TIT", "noburst": "GGG", "capped": "RIR"},
            1.65: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    assert k["K3"] is False  # seed 1's BURST was not trapped, so its CAPPED run does not count


def test_missing_runs_leave_a_condition_undetermined() -> None:
    k = _kill(
        {
            1.35: {"burst": "TTT", "noburst": "G--", "capped": "R--"},
            1.65: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    assert k["K1"] is None and k["K3"] is None and k["K2"] is False


def test_runs_that_do_not_count_leave_a_condition_undetermined_like_missing_ones() -> None:
    """A run the rule's count_if refused (NOT-COUNTED: e.g. its pinned speed did not hold) is no
    evidence either way: NOBURST's two not-counted seeds neither trigger K1 nor clear it."""
    k = _kill(
        {
            1.35: {"burst": "TTT", "noburst": "GXX", "capped": "RXX"},
            1.65: {"burst": "TTT", "noburst": "GGG", "capped": "RRR"},
        }
    )
    assert k["K1"] is None and k["K3"] is None and k["K2"] is False
