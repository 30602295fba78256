"""Every branch of every staged rule on synthetic per-run quantities: each outcome a family can
reach, the order in which outcomes are tried, and what missing or uncounted runs do."""

from __future__ import annotations

import math
from typing import Any

import pytest

from analysis.rules import judge_quantities, load_rule

NAN = float("nan")
FACTS = {"run.completed": True, "run.plan_ok": True, "run.cell_ok": True, "run.bound": True, "window_len": 3000.0}
REF = {"lambda_ref": 0.0715, "lam_miss": 0.0715, "all_miss_rate": 10000.0}


def good(**kw: Any) -> dict[str, Any]:
    return {
        "hit": 0.93,
        "followup_hit": 1.0,
        "slope": 0.0,
        "token_rate": 1000.0,
        "hit_last": 0.93,
        "outstanding_last": 2.0,
        **kw,
    }


def stuck(slope: float = 0.03, **kw: Any) -> dict[str, Any]:
    return {
        "hit": 0.0,
        "followup_hit": 0.0,
        "slope": slope,
        "token_rate": 10200.0,
        "hit_last": 0.0,
        "outstanding_last": 200.0,
        **kw,
    }


def row(arm: str, seed: int, q: dict[str, Any] | None, rate: float = 1.65, status: str = "complete") -> dict[str, Any]:
    quant = None if q is None else {**FACTS, **REF, "lam": rate * 0.0715, "rate": rate, **q}
    return {"arm": arm, "rate": rate, "seed": seed, "quantities": quant, "status": status}


def judge(
    rule: str,
    rows: list[dict[str, Any]],
    rates: tuple[float, ...] = (1.65,),
    seeds: tuple[int, ...] = (0, 1, 2),
    **over: Any,
) -> dict[str, Any]:
    return judge_quantities(load_rule(rule, over or None), rows, rates=list(rates), seeds=list(seeds))[0]


# ---------------------------------------------------------------------------------------------
# BASIN
# ---------------------------------------------------------------------------------------------
def test_basin1_pass_and_fail_branches() -> None:
    ok = [row("basin-n100", s, stuck()) for s in range(3)] + [row("basin-n25", s, good()) for s in range(3)]
    assert judge("basin-1", ok)["verdict"] == "PASS"
    # stuck but flat: not trapped by the co-primary slope rule in 2 seeds
    flat = [row("basin-n100", s, stuck(slope=0.001 if s else 0.03)) for s in range(3)] + ok[3:]
    v = judge("basin-1", flat)
    assert v["verdict"] == "FAIL" and v["groups"][0]["counts"]["stuck100"] == 1
    bad25 = ok[:3] + [row("basin-n25", s, stuck() if s < 2 else good()) for s in range(3)]
    assert judge("basin-1", bad25)["verdict"] == "FAIL"


def test_basin2_bracketed_not_bracketed_and_incomplete() -> None:
    rows = [row("basin-n40", s, good()) for s in range(3)] + [row("basin-n60", s, stuck()) for s in range(3)]
    v = judge("basin-2", rows)
    assert v["verdict"] == "BRACKETED"  # 50 is not needed: its role is not required
    rows2 = [row("basin-n40", s, stuck() if s else good()) for s in range(3)] + rows[3:]
    assert judge("basin-2", rows2)["verdict"] == "NOT-BRACKETED"
    # seed 2's 60-session run missing: 40 good 3/3 and 60 stuck 2/2 already decide
    v = judge("basin-2", rows[:5])
    assert v["verdict"] == "BRACKETED" and "undecided" in v["groups"][0]["reason"]
    # two 60-session runs missing: either outcome is still possible
    v = judge("basin-2", rows[:4])
    assert v["verdict"] == "INCOMPLETE" and v["groups"][0]["possible_outcomes"] == ["BRACKETED", "NOT-BRACKETED"]


def test_uncounted_and_short_runs_do_not_count() -> None:
    rows = [row("basin-n40", s, good()) for s in range(3)] + [row("basin-n60", s, stuck()) for s in range(3)]
    rows[3]["quantities"]["run.plan_ok"] = False  # not driven by the frozen plan
    rows[4]["quantities"]["window_len"] = 300.0  # shorter than min_window
    v = judge("basin-2", rows)
    st = {(r["arm"], r["seed"]): r["status"] for r in v["runs"]}
    assert st[("basin-n60", 0)] == "NOT-COUNTED" and st[("basin-n60", 1)] == "INVALID"
    assert v["verdict"] == "INCOMPLETE"
    failed = rows[:3] + [row("basin-n60", s, stuck(), status="FAILED" if s == 0 else "complete") for s in range(3)]
    v = judge("basin-2", failed)
    assert v["verdict"] == "BRACKETED" and v["groups"][0]["seeds"]["0"]["decided"] is False


# ---------------------------------------------------------------------------------------------
# TOOLSLOW
# ---------------------------------------------------------------------------------------------
def test_toolslow_r14_met_and_good_by_slope() -> None:
    rows = [row("toolslow-d10", s, good(), 1.35) for s in range(3)] + [
        row("toolslow-d30", s, stuck(), 1.35) for s in range(3)
    ]
    assert judge("toolslow", rows, (1.35,))["verdict"] == "MET"
    # r14's GOOD also takes a run that is not RECOVERED but hits with a flat backlog
    rows[0]["quantities"].update(outstanding_last=40.0, slope=0.001)
    rows[1]["quantities"].update(outstanding_last=40.0, slope=0.02)  # above 0.5 (lam - lam_ref) = 0.0125
    v = judge("toolslow", rows, (1.35,))
    labels = [r["labels"]["endpoint"] for r in v["runs"][:2]]
    assert labels == ["GOOD", "NEITHER"] and v["verdict"] == "MET"
    rows[2]["quantities"].update(outstanding_last=40.0, slope=0.02)
    assert judge("toolslow", rows, (1.35,))["verdict"] == "NOT-MET"


@pytest.mark.parametrize("kinds,outcome", [("SSG", "TRAPS"), ("GGS", "NO-TRAP"), ("SGN", "MIXED")])
def test_toolslow_three_way(kinds: str, outcome: str) -> None:
    q = {"S": stuck(), "G": good(), "N": good(hit_last=0.5, hit=0.5)}
    rows = [row("toolslow-w", s, q[k], 1.35) for s, k in enumerate(kinds)]
    assert judge("toolslow-3way", rows, (1.35,))["verdict"] == outcome


def _scored(slope: float, prompt: float, gap: float, comp: float, arr: float) -> dict[str, Any]:
    return stuck(
        slope,
        prompt_w=prompt,
        gap_slope_w=gap,
        sessions_completed_rate=comp,
        base_arrival_rate_window=arr,
        base_arrivals_ref=arr / 0.0715,
        slope_threshold=0.0125,
        **{"pred.tilted_prompt": 9000.0, "pred.gamma": 0.02, "pred.D": 0.085, "pred.alpha": 0.02},
    )


def test_trap_scores_refutation_needs_two_runs() -> None:
    # pooled S2 at 2.0 gamma: outside [0.6, 1.4]
    rows = [row("toolslow-w", s, _scored(0.02, 9000.0, 0.04, 0.086, 0.105), 1.35) for s in range(2)] + [
        row("toolslow-w", 2, good(), 1.35)
    ]
    g = judge("toolslow-3way", rows, (1.35,))["groups"][0]
    assert g["outcome"] == "TRAPS" and not g["checks"]["S2_pooled"]["holds"] and g["checks"]["refuted"]["holds"]
    one = [rows[0], row("toolslow-w", 1, good(), 1.35), rows[2]]
    g = judge("toolslow-3way", one, (1.35,))["groups"][0]
    assert g["aggregates"]["n_eligible"] == 1 and not g["checks"]["refuted"]["holds"]
    # composition 8.9% off in one run: S1 per run fails, pooled (+4.4%) passes
    mix = [
        row("toolslow-w", 0, _scored(0.02, 9800.0, 0.02, 0.086, 0.105), 1.35),
        row("toolslow-w", 1, _scored(0.02, 9000.0, 0.02, 0.086, 0.105), 1.35),
        rows[2],
    ]
    g = judge("toolslow-3way", mix, (1.35,))["groups"][0]
    assert (
        not g["checks"]["S1_per_run"]["holds"]
        and g["checks"]["S1_pooled"]["holds"]
        and not g["checks"]["refuted"]["holds"]
    )
    # trap-scores on BURST runs: NOT-APPLICABLE with one trapped run, REFUTED / NOT-REFUTED with two
    b = [row("burst", s, _scored(0.02, 9000.0, 0.04 if s < 2 else 0.02, 0.086, 0.105), 1.35) for s in range(3)]
    assert judge("trap-scores", b, (1.35,))["groups"][0]["outcome"] == "REFUTED"
    b2 = [row("burst", s, _scored(0.02, 9000.0, 0.02, 0.086, 0.105), 1.35) for s in range(3)]
    assert judge("trap-scores", b2, (1.35,))["groups"][0]["outcome"] == "NOT-REFUTED"
    assert (
        judge("trap-scores", [*b2[:1], row("burst", 1, good(), 1.35), row("burst", 2, good(), 1.35)], (1.35,))[
            "groups"
        ][0]["outcome"]
        == "NOT-APPLICABLE"
    )


# ---------------------------------------------------------------------------------------------
# SHED
# ---------------------------------------------------------------------------------------------
def test_shed_needs_every_seed() -> None:
    rows = [row("shed-t600", s, stuck(), 1.35) for s in range(2)] + [
        row("shed-t3600", s, good(), 1.35) for s in range(2)
    ]
    assert judge("shed", rows, (1.35,), (0, 1))["verdict"] == "PASS"
    rows[1] = row("shed-t600", 1, good(), 1.35)
    assert judge("shed", rows, (1.35,), (0, 1))["verdict"] == "FAIL"
    assert (
        judge("shed", rows, (1.35,), (0, 1), shed_fraction=0.5)["verdict"] == "PASS"
    )  # a registration may read it 1 of 2


# ---------------------------------------------------------------------------------------------
# rescue
# ---------------------------------------------------------------------------------------------
def rescued(release: float = 4500.0, post_min: float = 0.95, **kw: Any) -> dict[str, Any]:
    q = {
        "pre_hit": 0.0,
        "outstanding_on": 150,
        "gate.engage": 1800.0,
        "gate.release": release,
        "post.min": post_min,
        "post.empty": 0,
        "post.whole": 0.99,
        "failed_sessions": 0,
        "post_tokens": 1000.0,
    }
    return good(**{**q, **kw})


def control(**kw: Any) -> dict[str, Any]:
    return stuck(control_hit_after=0.0, failed_sessions=0, **kw)


def _rescue_rows(
    rates: tuple[float, ...] = (1.35, 1.65), runs: dict[tuple[float, int], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    out = []
    for r in rates:
        for s in range(3):
            out.append(row("rescue-r1", s, (runs or {}).get((r, s), rescued()), r))
            out.append(row("burst", s, control(), r))
    return out


def test_rescue_pass_and_per_run_clauses() -> None:
    v = judge("rescue-r1", _rescue_rows(), (1.35, 1.65))
    assert v["verdict"] == "PASS" and v["test_checks"]["nothing_shed"]["holds"]
    bad = {(1.35, 0): rescued(outstanding_on=40), (1.35, 1): rescued(**{"gate.engage": 1830.0})}  # VALID fails twice
    v = judge("rescue-r1", _rescue_rows(runs=bad), (1.35, 1.65))
    g = v["groups"][0]
    assert g["outcome"] == "FAIL" and g["counts"]["rescued"] == 1 and v["verdict"] == "FAIL"
    labels = {(r["rate"], r["seed"]): r["labels"]["valid"] for r in v["runs"] if r["arm"] == "rescue-r1"}
    assert labels[(1.35, 0)] == labels[(1.35, 1)] == "NOT-VALID"
    # a window with no completed follow-up fails POSTGOOD without being a relapse
    v = judge("rescue-r1", _rescue_rows(runs={(1.65, 2): rescued(**{"post.empty": 1})}), (1.35, 1.65))
    r = next(x for x in v["runs"] if x["arm"] == "rescue-r1" and x["rate"] == 1.65 and x["seed"] == 2)
    assert r["labels"]["postgood"] == "NOT-POSTGOOD" and not r["flags"]["relapse"] and v["verdict"] == "PASS"


def test_rescue_control_must_be_stuck() -> None:
    rows = _rescue_rows()
    rows[1] = row("burst", 0, control(hit_last=0.9, outstanding_last=3.0), 1.35)  # the control recovered
    v = judge("rescue-r1", rows, (1.35, 1.65))
    assert v["groups"][0]["outcome"] == "FAIL" and v["verdict"] == "FAIL"


def test_rescue_refutation_takes_precedence_and_release_clause() -> None:
    # one relapse at each rate: each rate still passes 2 of 3, but R1 is refuted (2 of its 6 runs)
    runs = {(1.35, 0): rescued(post_min=0.1), (1.65, 1): rescued(post_min=0.15)}
    v = judge("rescue-r1", _rescue_rows(runs=runs), (1.35, 1.65))
    assert [g["outcome"] for g in v["groups"]] == ["PASS", "PASS"] and v["verdict"] == "REFUTED"
    # not released by 7200 s counts toward refutation (R1, and R4 as decided), not under R4's printed reading
    late = {(4.0, 0): rescued(release=7300.0), (4.0, 1): rescued(release=NAN)}
    rows = [row("rescue-r4", s, {**late.get((4.0, s), rescued()), "gate.engage": 2100.0}, 4.0) for s in range(3)]
    rows += [row("burst", s, control(), 4.0) for s in range(3)]
    assert judge("rescue-r4", rows, (4.0,))["verdict"] == "REFUTED"
    v = judge("rescue-r4", rows, (4.0,), refute_on_release=0)
    assert v["verdict"] == "FAIL" and v["groups"][0]["counts"]["rescued"] == 1


def test_rescue_failed_session_withdraws_nothing_shed() -> None:
    v = judge("rescue-r1", _rescue_rows(runs={(1.35, 2): rescued(failed_sessions=1)}), (1.35, 1.65))
    assert v["verdict"] == "PASS" and not v["test_checks"]["nothing_shed"]["holds"]


# ---------------------------------------------------------------------------------------------
# CUT
# ---------------------------------------------------------------------------------------------
def cut(S: float, F: float, late: float = 0.005, lam_plan: float = 0.085, **kw: Any) -> dict[str, Any]:
    return stuck(s_slope=S, late_slope=late, lam_plan=lam_plan, **{"pred.slope": F, "pred.d_trap": 0.095}, **kw)


def test_cut_a_branches() -> None:
    # naive = 0.085 - 0.095 = -0.010; quasi-static = 0.085 - 0.0715 = +0.0135
    fav = [row("cut-a115", s, cut(0.004, 0.0039)) for s in range(3)]
    assert judge("cut-a", fav, d_trap_source="predictions")["verdict"] == "PASS"
    # the sign clause: late slopes negative in 2 of 3 -> not PASS, and not FAIL either
    neg = [row("cut-a115", s, cut(0.004, 0.0039, late=-0.001 if s else 0.002)) for s in range(3)]
    assert judge("cut-a", neg, d_trap_source="predictions")["verdict"] == "MIXED"
    # the quasi-static comparator closer in 2 seeds -> FAIL
    qs = [row("cut-a115", s, cut(0.013 if s else 0.004, 0.0039)) for s in range(3)]
    v = judge("cut-a", qs, d_trap_source="predictions")
    assert v["verdict"] == "FAIL" and v["groups"][0]["counts"]["comparator_favoured"] == 2
    # leaving the trap counts toward FAIL even where model F is closest
    left = [row("cut-a115", s, {**cut(0.004, 0.0039), **(good() if s else {})}) for s in range(3)]
    v = judge("cut-a", left, d_trap_source="predictions")
    assert v["verdict"] == "FAIL" and v["groups"][0]["counts"]["left_trap"] == 2


def test_cut_b_naive_only_and_d_trap_from_control() -> None:
    # S -0.012 is nearer the quasi-static -0.0135 than F -0.006, but CUT-B has no quasi-static comparator
    rows = [row("cut-b085", s, cut(-0.012, -0.006, lam_plan=0.058)) for s in range(3)]
    v = judge("cut-b", rows, d_trap_source="predictions")
    assert v["verdict"] == "PASS" and v["groups"][0]["counts"]["sign"] == 3
    assert (
        judge(
            "cut-a",
            [row("cut-a115", s, cut(-0.012, -0.006, lam_plan=0.058)) for s in range(3)],
            d_trap_source="predictions",
        )["verdict"]
        == "FAIL"
    )
    # D_trap measured on the same-seed uncut control: required then, and missing controls leave it open
    with_ctrl = rows + [row("burst", s, stuck(d_own=0.095)) for s in range(3)]
    assert judge("cut-b", with_ctrl)["verdict"] == "PASS"
    assert judge("cut-b", rows)["verdict"] == "INCOMPLETE"


# ---------------------------------------------------------------------------------------------
# MIRROR
# ---------------------------------------------------------------------------------------------
def mirror(c1: float, wave: float, c3: float, slope: float, stuck_run: bool = True) -> dict[str, Any]:
    base = stuck() if stuck_run else good()
    return {
        **base,
        "c_blackout": c1,
        "wave.time": wave,
        "c_late": c3,
        "slope_m4": slope,
        **{"pred.wave": 5150.0, "pred.slope": 0.085, "pred.qs_slope": 0.045},
    }


@pytest.mark.parametrize(
    "seeds,label,cell",
    [
        ([(0.07, 5000, 0.6, 0.083)] * 3, "RENEWAL", "PASS"),
        ([(0.9, 4000, 0.95, 0.05)] * 3, "CURVE", "FAIL"),
        ([(0.9, 4000, 0.95, 0.05, False)] * 3, "NOT-TRAPPED", "NO-TRAP"),
        ([(0.5, 5000, 0.6, 0.083)] * 3, "MIXED", "MIXED"),
    ],
)
def test_mirror_labels_and_cells(seeds: list[tuple[Any, ...]], label: str, cell: str) -> None:
    rows = [row("burst", s, mirror(*x)) for s, x in enumerate(seeds)]
    v = judge("mirror", rows)
    assert {r["labels"]["mirror"] for r in v["runs"]} == {label} and v["verdict"] == cell


def test_mirror_m2_and_m4_each_decide() -> None:
    late_wave = [
        row("burst", s, mirror(0.07, 5150 + 0.16 * 3950, 0.6, 0.083)) for s in range(3)
    ]  # 16% of F - 1200 late
    assert judge("mirror", late_wave)["verdict"] == "MIXED"
    qs_side = [row("burst", s, mirror(0.07, 5000, 0.6, 0.06)) for s in range(3)]  # nearer 0.045 than 0.085
    assert judge("mirror", qs_side)["verdict"] == "MIXED"


# ---------------------------------------------------------------------------------------------
# E0b and persistence
# ---------------------------------------------------------------------------------------------
def e0b(final: float, rise: float) -> dict[str, Any]:
    return {"e0b.final": final, "e0b.rise": rise}


def test_e0b_edge_monotone_and_seeds() -> None:
    rates = (1.5, 2.0, 2.5)
    rows = [row("noburst", 0, e0b(0, 0), 1.5), row("noburst", 0, e0b(60, 0), 2.0), row("noburst", 0, e0b(0, 2), 2.5)]
    v = judge("e0b", rows, rates, (0,))
    assert v["verdict"] == "NON-MONOTONE" and v["test_derived"]["edge"] == 1.5
    rows = [row("noburst", 0, e0b(0, 0), r) for r in rates]
    assert judge("e0b", rows, rates, (0,))["verdict"] == "ALL-STABLE"
    rows = [row("noburst", 0, e0b(0, 20), r) for r in rates]
    v = judge("e0b", rows, rates, (0,))
    assert v["verdict"] == "NO-STABLE-RATE" and math.isnan(v["test_derived"]["edge"] or NAN)
    # a rate is stable only if every seed is (AMB-2)
    two = [row("noburst", s, e0b(0, 0), 1.5) for s in range(2)] + [
        row("noburst", 0, e0b(0, 0), 2.0),
        row("noburst", 1, e0b(80, 5), 2.0),
    ]
    v = judge("e0b", two, (1.5, 2.0), (0, 1))
    assert [g["outcome"] for g in v["groups"]] == ["STABLE", "UNSTABLE"] and v["test_derived"]["edge"] == 1.5


def test_persistence_escape_and_no_onset() -> None:
    rows = [
        row(
            "burst",
            0,
            {"persist.onset": 1300.0, "persist.escape": 5000.0, "persist.trapped_s": 3700.0, "persist.max_after": 0.6},
        ),
        row(
            "burst",
            1,
            {"persist.onset": NAN, "persist.escape": NAN, "persist.trapped_s": 0.0, "persist.max_after": NAN},
        ),
    ]
    v = judge("persistence", rows, (1.65,), (0, 1))
    assert v["verdict"] == "ESCAPES" and v["test_aggregates"]["n_onset"] == 1
    labels = [r["labels"]["persistence"] for r in v["runs"]]
    assert labels == ["ESCAPED", "NO-ONSET"]
    assert judge("persistence", rows[1:], (1.65,), (1,))["verdict"] == "NO-ONSET"
