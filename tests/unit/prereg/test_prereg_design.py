"""The design step before registration (prereg/design.py, prereg/decidable.py, prereg/margin.py,
prereg/design_record.py): reachability by formula, the flip margin, the design record the fill
binds, and the submission's refusal of a registration that can only FAIL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.paths import REPO

from prereg.decidable import decisive_hints, undecidable_reasons
from prereg.design import Design, formula_eval, load_context, protocol_for, rule_for
from prereg.design_record import DESIGN_FILE, bound_design, write_design
from prereg.fill import fill_registration
from prereg.margin import flip_margin
from prereg.registration import RegistrationError, load_registration
from slurm.submit import SubmitOptions, SubmitRefused, plan_submission

ROOT = REPO
OLD_REG = ROOT / "prereg" / "registrations" / "e2-vllm-cpu-tiny-131k.yaml"
OLD_INPUTS = ROOT / "prereg" / "inputs" / "vllm-cpu-tiny-131k"
OLD_TEMPLATE = ROOT / "prereg" / "templates" / "e2-vllm-cpu-tiny-131k.yaml"
COST = ROOT / "configs" / "costs" / "vllm-cpu-tiny-q05-fitted.yaml"


# ------------------------------------------------------------------------------ the flip margin
def test_flip_margin_finds_the_change_that_flips_each_side_by_bisection() -> None:
    calls: list[float] = []

    def state(f: float) -> str:
        calls.append(f)
        return "RECOVERED" if f > 1.23 else ("TRAPPED" if f > 0.81 else "DRAINING")

    m = flip_margin(state, max_change=0.5, tol=0.01)
    assert m.base == "TRAPPED"
    assert m.faster == pytest.approx(0.23, abs=0.011) and m.faster > 0.23  # the first change at which the state differs
    assert m.slower == pytest.approx(0.19, abs=0.011) and m.margin == m.slower
    assert (
        m.evaluations == len(calls) == 1 + 2 * (1 + 6)
    )  # the base, then per side the largest change and log2(0.5 / 0.01) halvings


def test_flip_margin_says_when_nothing_flips_within_the_largest_change() -> None:
    m = flip_margin(lambda f: "RECOVERED", max_change=0.3)
    assert m.faster is None and m.slower is None and m.margin == 0.3 and not m.to_json()["bounded"]
    with pytest.raises(ValueError, match="max_change"):
        flip_margin(lambda f: "X", max_change=1.5)


# ------------------------------------------------------------------- reachability by formula
def test_the_old_cpu_registration_can_only_fail_and_says_why() -> None:
    reg = load_registration(OLD_REG)
    (why,) = undecidable_reasons(reg)
    assert (
        why.startswith("CAPPED cannot recover at either rate")
        and "1,595 s and 3,157 s" in why
        and "115 s budget" in why
    )
    hints = decisive_hints(reg)
    assert len(hints) == 2 and "burst of at most 46 sessions" in hints[0] and "runs of at least" in hints[1]


def test_a_paper_registration_whose_drains_fit_is_not_flagged() -> None:
    for name in ("e2-sglang-a100-300k", "e2-vllm-a100-300k"):
        assert undecidable_reasons(load_registration(ROOT / "prereg" / "registrations" / f"{name}.yaml")) == []


def test_the_design_step_reports_capped_unreachable_on_the_old_template_before_any_run() -> None:
    ctx = load_context(OLD_INPUTS, OLD_TEMPLATE, COST)
    fe = formula_eval(ctx, ctx.baseline())
    assert fe.multiples == [1.35, 1.7] and fe.cap == 96 and fe.budget_s == pytest.approx(115.2)
    assert not fe.ok and any(r.startswith("CAPPED cannot recover at either rate") for r in fe.reasons)
    assert [d["fits"] for d in fe.drains] == [False, False]
    assert fe.runs == 18 and fe.engine_hours(75.0) == pytest.approx(18 * (174 + 75) / 3600)


def test_design_knobs_map_onto_a_protocol_and_its_rule() -> None:
    ctx = load_context(OLD_INPUTS, OLD_TEMPLATE, COST)
    same = protocol_for(ctx.protocol, ctx.baseline())
    keys = ("duration", "burst", "window", "min_window", "backlog_bin", "hit_bin", "recovered_span", "gauge_interval")
    assert {k: getattr(same, k) for k in keys} == {k: getattr(ctx.protocol, k) for k in keys}
    d = Design(2.0, 3.0, 160, 2.0, 0.8, ((1, 5), (2, 5)))
    p = protocol_for(ctx.protocol, d)
    assert p.burst.time == 48.0 and p.burst.size == 160 and p.burst.width == pytest.approx(1.2 * 2 * 2)
    assert (
        p.duration == pytest.approx(48 + 150 * 2 * 3)
        and p.backlog_bin == pytest.approx(0.4)
        and p.recovered_span == pytest.approx(12)
    )
    assert (p.window.start - p.burst.time) / (p.duration - p.burst.time) == pytest.approx(
        0.6
    )  # the window keeps its share
    rule = rule_for(ctx.rule, p)
    assert (rule["params"]["min_window"], rule["params"]["backlog_bin"], rule["params"]["recovered_span"]) == (
        p.min_window,
        p.backlog_bin,
        p.recovered_span,
    )
    assert rule["params"]["rate_tolerance"] == ctx.rule["params"]["rate_tolerance"]
    fe = formula_eval(ctx, d)
    assert fe.multiples == [1.2, 1.4] and fe.cap == 48  # cap rule at 0.8 mu*: the smallest n with mu(n) >= 0.933
    short = formula_eval(ctx, Design(1.0, 0.05, 160, 1.0, 0.95, ((1, 3), (2, 3))))
    assert not short.ok and "no valid protocol" in short.reasons[0]


def test_a_kept_time_stays_the_templates_and_the_65k_proposal_with_it_is_the_registered_protocol() -> None:
    """protocols/e2-cpu-quarter.yaml is the design step's proposal for the 65k template with RECOVERED's
    span kept at 6 s: the knobs reproduce it (and its rule's times) from the template's protocol."""
    from harness.config import ProtocolConfig, load_config
    from harness.errors import ConfigError
    from prereg.design_search import Grid

    inputs = ROOT / "prereg" / "inputs" / "vllm-cpu-tiny-65k"
    ctx = load_context(
        inputs,
        ROOT / "prereg" / "templates" / "e2-vllm-cpu-tiny-65k.yaml",
        ROOT / "configs" / "costs" / "vllm-cpu-tiny-65k-fit2.yaml",
    )
    d = Design(0.25, 3.0, 120, 1.0, 0.95, ((1, 4), (1, 2)), ("recovered_span",))
    p = protocol_for(ctx.protocol, d)
    want = load_config("protocols/e2-cpu-quarter", ProtocolConfig)
    keys = ("duration", "burst", "window", "min_window", "backlog_bin", "hit_bin", "recovered_span", "gauge_interval")
    assert {k: getattr(p, k) for k in keys} == {k: getattr(want, k) for k in keys}
    scaled = protocol_for(ctx.protocol, Design(0.25, 3.0, 120, 1.0, 0.95, ((1, 4), (1, 2))))
    assert scaled.recovered_span == pytest.approx(1.5) and p.recovered_span == ctx.protocol.recovered_span == 6.0
    assert rule_for(ctx.rule, p)["params"]["recovered_span"] == 6.0
    assert d.to_json()["kept_times"] == ["recovered_span"] and "recovered_span kept" in d.label()
    fe = formula_eval(ctx, d)
    assert fe.ok and fe.multiples == [1.25, 1.5] and fe.cap == 32
    assert fe.budget_s == pytest.approx(0.8 * (118.5 - 6.0 - 6.0))  # the kept span comes out of CAPPED's budget
    assert all(g.kept == ("recovered_span",) for g in Grid(kept_times=("recovered_span",)).designs(640))
    with pytest.raises(ConfigError, match="kept_times"):
        Grid(kept_times=("duration",))


# ------------------------------------------------------------------------- the design record
def _record(ctx_template: Path, inputs: Path, decisive: bool = True) -> dict:
    import hashlib

    files = {s: hashlib.sha256((inputs / f"{s}.yaml").read_bytes()).hexdigest() for s in ("stage-c", "e0a", "e0b")}
    return {
        "format": "agentload-design",
        "format_version": 1,
        "name": "t",
        "template": {"path": "t.yaml", "sha256": hashlib.sha256(ctx_template.read_bytes()).hexdigest()},
        "inputs": [{"role": s, "path": f"{s}.yaml", "sha256": h} for s, h in files.items()],
        "decisive": decisive,
        "undecidable": [],
        "baseline": {"why_not": None if decisive else "BURST at 1.35: TRAPPED in 1 of 5"},
        "proposal": None,
    }


def test_the_fill_binds_a_design_record_beside_the_inputs_and_refuses_one_for_another_template(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    shutil.copytree(OLD_INPUTS, inputs)
    sha = write_design(_record(OLD_TEMPLATE, inputs, decisive=False), inputs / DESIGN_FILE)
    assert (
        write_design(_record(OLD_TEMPLATE, inputs, decisive=False), tmp_path / "again.yaml") == sha
    )  # same record, same bytes
    res = fill_registration(inputs, OLD_TEMPLATE, repo_root=ROOT)
    bound = [i for i in res.registration.inputs if i.role == "design"]
    assert len(bound) == 1 and bound[0].sha256 == sha
    assert res.registration.fill["design"]["decisive"] is False
    assert any("not decisive by design" in r or "can only FAIL" in r for r in undecidable_reasons(res.registration))
    other = tmp_path / "other.yaml"
    other.write_text(OLD_TEMPLATE.read_text() + "\n# edited\n")
    with pytest.raises(RegistrationError, match="made for another template"):
        bound_design(inputs, other, {}, None)
    (inputs / "e0a.yaml").write_text((inputs / "e0a.yaml").read_text() + "\n")
    with pytest.raises(RegistrationError, match="the e0a summary's SHA-256"):
        fill_registration(inputs, OLD_TEMPLATE, repo_root=ROOT)


def test_without_a_design_record_the_committed_fill_is_unchanged() -> None:
    res = fill_registration(OLD_INPUTS, OLD_TEMPLATE, repo_root=ROOT)
    assert res.registration.raw == OLD_REG.read_bytes()


# ------------------------------------------------------------------------------ the submission
def test_submit_refuses_the_old_registration_with_the_reason_and_a_decisive_design() -> None:
    with pytest.raises(SubmitRefused) as info:
        plan_submission(OLD_REG, SubmitOptions(executor="local", engine="vllm", dry_run=True))
    msg = str(info.value)
    assert "undecidable by design" in msg and "CAPPED cannot recover at either rate" in msg
    assert (
        "burst of at most 46 sessions" in msg
        and "agentload prereg design --inputs prereg/inputs/vllm-cpu-tiny-131k" in msg
    )
    assert "--accept-undecidable" in msg


def test_submit_accept_undecidable_goes_past_that_refusal_and_records_it() -> None:
    said: list[str] = []
    try:
        doc = plan_submission(
            OLD_REG,
            SubmitOptions(executor="local", engine="vllm", dry_run=True, accept_undecidable=True),
            echo=said.append,
        )
    except SubmitRefused as exc:  # a dirty tree or an unpushed commit may still refuse it: never for undecidability
        assert "undecidable by design" not in str(exc)
    else:
        assert doc["check"]["undecidable_accepted"][0].startswith("CAPPED cannot recover")
    assert any(s.startswith("accepted undecidable: CAPPED cannot recover") for s in said)


def test_the_design_command_prints_the_table_and_the_undecidable_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    out = tmp_path / "design.yaml"
    rc = main(
        [
            "prereg",
            "design",
            "--inputs",
            str(OLD_INPUTS),
            "--test",
            str(OLD_TEMPLATE),
            "--cost",
            str(COST),
            "--seeds",
            "2",
            "--need",
            "2",
            "--margin",
            "0",
            "--no-search",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "UNDECIDABLE: CAPPED cannot recover at either rate" in text and "1,595 s NO" in text and "3,157 s NO" in text
    assert "not decisive" in text and "full test 18 runs" in text
    import yaml

    rec = yaml.safe_load(out.read_text())
    assert rec["format"] == "agentload-design" and rec["decisive"] is False
    assert rec["undecidable"][0].startswith("CAPPED cannot recover at either rate")
    assert [c["arm"] for c in rec["baseline"]["simulated"]["counts"] if c["speed_factor"] == 1.0].count("CAPPED") == 2
    assert (
        rec["references"]["all_miss_token_rate"] == pytest.approx(2335.33, abs=0.01)
        and rec["template"]["path"] == "prereg/templates/e2-vllm-cpu-tiny-131k.yaml"
    )
    assert "search: not run (--no-search)" in text


# ------------------------------------------------------------------------------------ the search
def test_the_search_proposes_the_cheapest_design_every_arm_reaches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator replaced by a rule of thumb (a burst of at least 200 traps; a gate recovers):
    the search must skip what the formulas rule out, simulate the rest cheapest first and stop at
    the first design where every arm meets its registered state in k of n seeds at every speed."""
    import prereg.design as D
    import prereg.design_search as S

    seen: list[tuple[str, int, float]] = []

    def fake_state(bundle, arm, rate, seed, factor, rule, refs):
        b = bundle.protocol.burst.size
        seen.append((arm.upper(), b, factor))
        if arm.upper() == "BURST":
            return ("TRAPPED" if b >= 200 else "RECOVERED"), {}
        return "RECOVERED", {}

    monkeypatch.setattr(D, "_state", fake_state)
    monkeypatch.setattr(D, "_STATES", {})
    ctx = load_context(OLD_INPUTS, OLD_TEMPLATE, COST)
    grid = S.Grid(
        time_factors=(1.0,),
        post_factors=(1.0, 8.0, 16.0),
        burst_factors=(1.0, 0.375, 0.25, 0.125),
        width_factors=(1.0,),
        cap_fractions=(0.95,),
        fractions=(((1, 5), (2, 5)),),
    )
    res = S.search(ctx, grid, seeds=[1000, 1001, 1002], need=3, margin=0.1, overhead_s=60.0, max_candidates=20)
    assert not res.baseline.decisive and any("CAPPED cannot recover" in r for r in res.baseline.formula.reasons)
    assert res.proposal is not None and res.proposal.decisive
    d = res.proposal.formula.design
    assert d.burst >= 200 and all(x["fits"] for x in res.proposal.formula.drains)
    hours = [e.formula.engine_hours(60.0) for e in res.evaluated]
    assert hours == sorted(hours) and res.evaluated[-1] is res.proposal  # cheapest first, stopped at the first decisive
    assert all(not e.decisive for e in res.evaluated[:-1])
    assert res.pruned > 0 and res.candidates == len([x for x in grid.designs(640) if x != ctx.baseline()])
    assert {f for _, _, f in seen} == {1.0, 0.9, 1.1}  # each arm also at the speed moved by the margin
    hours_cap = res.proposal.formula.engine_hours(60.0) * 0.99  # just under the proposal's: it must be pruned now
    capped = S.search(
        ctx, grid, seeds=[1000, 1001, 1002], need=3, margin=0.1, overhead_s=60.0, max_candidates=20, max_hours=hours_cap
    )
    assert capped.proposal is None or capped.proposal.formula.engine_hours(60.0) <= hours_cap
    assert all(e.formula.engine_hours(60.0) <= hours_cap for e in capped.evaluated)


def test_a_run_state_is_simulated_once_for_designs_that_differ_only_in_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import prereg.design as D

    calls: list[str] = []

    def fake_state(bundle, arm, rate, seed, factor, rule, refs):
        calls.append(arm.upper())
        return ("TRAPPED" if arm.upper() == "BURST" else "RECOVERED"), {}

    monkeypatch.setattr(D, "_state", fake_state)
    monkeypatch.setattr(D, "_STATES", {})
    ctx = load_context(OLD_INPUTS, OLD_TEMPLATE, COST)
    a = D.formula_eval(ctx, D.Design(1.0, 16.0, 160, 1.0, 0.95, ((1, 5), (2, 5))))
    b = D.formula_eval(ctx, D.Design(1.0, 16.0, 160, 1.0, 0.8, ((1, 5), (2, 5))))
    assert a.ok and b.ok and a.cap != b.cap
    assert ctx.seeds == [0, 1, 2]
    D.sim_eval(ctx, a, seeds=[1000, 1001], need=2, margin=0.0)
    n = calls.count("BURST")
    D.sim_eval(ctx, b, seeds=[1000, 1001], need=2, margin=0.0)
    # per design and arm: 2 rates x (2 fresh + 3 registered seeds); BURST and NOBURST reused, CAPPED's cap differs
    assert calls.count("BURST") == n == 10 and calls.count("CAPPED") == 20


def test_a_decisive_template_over_a_limit_set_does_not_end_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--max-ci-minutes 5` on a template that is decisive but whose CI version takes 6.5 minutes:
    the search must go on to the cheapest decisive design within the limit (a shorter post-burst
    time), not stop at the template; without a limit the template itself is the proposal."""
    import prereg.design as D
    import prereg.design_search as S

    def fake_state(bundle, arm, rate, seed, factor, rule, refs):  # every arm in its state, at any length
        return ("TRAPPED" if arm.upper() == "BURST" else "RECOVERED"), {}

    monkeypatch.setattr(D, "_state", fake_state)
    monkeypatch.setattr(D, "_STATES", {})
    fp32 = ROOT / "prereg" / "inputs" / "vllm-cpu-tiny-65k-fp32"
    ctx = load_context(
        fp32,
        ROOT / "prereg" / "templates" / "e2-vllm-cpu-tiny-65k-fp32.yaml",
        ROOT / "configs" / "costs" / "vllm-cpu-tiny-65k-fp32-fit.yaml",
    )
    grid = S.Grid(
        post_factors=(0.5, 1.0), burst_factors=(1.0,), width_factors=(1.0,), cap_fractions=(0.95,),
        fractions=(((1, 4), (1, 2)),),
    )  # fmt: skip
    kw = {"seeds": [1000, 1001], "need": 2, "margin": 0.0, "overhead_s": 75.0}
    free = S.search(ctx, grid, **kw)
    assert free.proposal is free.baseline and free.baseline.decisive and not free.baseline.over_limits
    limit = 300.0
    assert free.baseline.formula.ci_seconds(75.0) > limit  # 2 x (118.5 + 75) s
    res = S.search(ctx, grid, **kw, max_ci_s=limit)
    assert res.baseline.decisive and any("CI version" in r for r in res.baseline.over_limits)
    assert res.proposal is not None and res.proposal is not res.baseline
    assert res.proposal.formula.design.post_factor == 0.5 and res.proposal.formula.ci_seconds(75.0) <= limit


def test_a_design_whose_registered_seeds_miss_their_states_is_not_decisive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh seeds all trap but the template's own seeds' BURST plans do not (as happened with half
    the fp32 cell's post-burst time: 5 of 5 fresh seeds, registered seeds INDETERMINATE, DRAINING,
    INDETERMINATE; the real engine then ended DRAINING): the design is not decisive, and the reason
    names the registered seeds; with them in their states it is."""
    import prereg.design as D

    bad_registered: set[int] = {1}

    def fake_state(bundle, arm, rate, seed, factor, rule, refs):
        if arm.upper() == "BURST":
            return ("DRAINING" if seed in bad_registered else "TRAPPED"), {}
        return "RECOVERED", {}

    monkeypatch.setattr(D, "_state", fake_state)
    monkeypatch.setattr(D, "_STATES", {})
    ctx = load_context(
        ROOT / "prereg" / "inputs" / "vllm-cpu-tiny-65k-fp32",
        ROOT / "prereg" / "templates" / "e2-vllm-cpu-tiny-65k-fp32.yaml",
        ROOT / "configs" / "costs" / "vllm-cpu-tiny-65k-fp32-fit.yaml",
    )
    fe = D.formula_eval(ctx, ctx.baseline())
    ev = D.sim_eval(ctx, fe, seeds=[1000, 1001, 1002], need=3, margin=0.1)
    assert not ev.decisive and "registered seeds" in ev.reason and "DRAINING" in ev.reason
    assert all(c.good == c.done == 3 for c in ev.counts)  # every fresh seed was in its state
    assert ev.registered[-1].arm == "BURST" and ev.registered[-1].states == ["TRAPPED", "DRAINING", "TRAPPED"]
    bad_registered.clear()
    monkeypatch.setattr(D, "_STATES", {})
    ok = D.sim_eval(ctx, fe, seeds=[1000, 1001, 1002], need=3, margin=0.1)
    assert ok.decisive and len(ok.registered) == len(fe.multiples) * len(ctx.arms)
    assert all(c.good == c.done == len(ctx.seeds) for c in ok.registered)
