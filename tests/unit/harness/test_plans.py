"""Session plans: the turn law, common random numbers across rates/arms/cells, byte-identity."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import DEFAULT_TOP_RATE as TOP_RATE
from harness.config import ArmConfig, ProtocolConfig, WorkloadConfig, load_config
from harness.errors import PlanError
from harness.workload.draws import (
    STREAM_BASE,
    STREAM_BURST,
    draw_session,
    expected_turns,
    hit_ceiling,
    mean_turn_prompt,
    turn_count,
    turn_survival,
)
from harness.workload.planfile import plan_bytes, read_plan, write_plan
from harness.workload.plans import (
    BURST_DRAW,
    burst_offsets,
    ks_exponential,
    make_plan,
    rate_report,
    regenerate,
    top_process,
)

W = load_config("workloads/standard", WorkloadConfig)
MIRROR = load_config("workloads/mirror-k20", WorkloadConfig)
E2 = load_config("protocols/e2", ProtocolConfig)
ARMS = {
    a: load_config(f"arms/{a}", ArmConfig)
    for a in (
        "burst",
        "noburst",
        "capped",
        "rescue-r1",
        "toolslow-d30",
        "toolslow-w",
        "shed-t600",
        "cut-a115",
        "cut-b085",
    )
}
LREF = 0.071534
SHORT = ProtocolConfig(name="short", duration=3000.0, window={"start": 2000.0, "end": 3000.0})


def _base(plan):
    return [s for s in plan.sessions if s.stream == STREAM_BASE]


def _burst(plan):
    return sorted((s for s in plan.sessions if s.stream == STREAM_BURST), key=lambda s: s.index)


# -------------------------------------------------------------------------------------------------
# the workload's laws
# -------------------------------------------------------------------------------------------------
def test_mean_turn_prompt_is_the_prompt_a_sent_turn_carries_on_average() -> None:
    """Over the sessions' turns, the mean of L_k: sum over sessions of their prompts' lengths over the
    number of turns sent, from the capped law's P(T = t) and L_k = first + (tool + decode)(k - 1)."""
    w = load_config("workloads/cpu-scaled", WorkloadConfig)
    p, cap = 1 / w.turns.mean, int(w.turns.cap)
    pmf = [(1 - p) ** (t - 1) * p for t in range(1, cap)] + [(1 - p) ** (cap - 1)]
    step = w.tool_tokens + w.decode_tokens
    tokens = sum(q * sum(w.first_prompt + step * (k - 1) for k in range(1, t + 1)) for t, q in enumerate(pmf, 1))
    turns = sum(q * t for t, q in enumerate(pmf, 1))
    assert mean_turn_prompt(w) == pytest.approx(tokens / turns, rel=1e-12)


def test_turn_law_mean_analytic_and_sampled() -> None:
    p, cap = 1 / 15, 60
    closed_form = (1 - (1 - p) ** cap) / p
    assert expected_turns(W) == pytest.approx(closed_form, rel=1e-12)
    assert round(expected_turns(W), 3) == 14.761
    assert turn_survival(W).sum() == pytest.approx(closed_form)
    # direct sum of k P(T = k) over the capped law
    pmf = [(1 - p) ** (k - 1) * p for k in range(1, cap)] + [(1 - p) ** (cap - 1)]
    assert sum(k * q for k, q in zip(range(1, cap + 1), pmf)) == pytest.approx(14.761, abs=5e-4)
    # sampling through the inverse CDF the plans use
    u = np.random.default_rng(12345).random(200_000)
    t = np.array([turn_count(float(x), 15.0, 60) for x in u])
    assert t.min() == 1 and t.max() == 60
    se = t.std() / math.sqrt(len(t))
    assert abs(t.mean() - 14.761) < 4 * se
    # and through draw_session itself (the per-session streams)
    n = np.array([draw_session(W, 7, STREAM_BASE, i).n_turns for i in range(4000)])
    assert abs(n.mean() - 14.761) < 4 * n.std() / math.sqrt(len(n))


def test_prompt_lengths_and_hit_ceiling() -> None:
    assert [W.prompt_len(k) for k in range(1, 61)] == [2000 + 650 * (k - 1) for k in range(1, 61)]
    assert hit_ceiling(W) == pytest.approx(1 - 1 / 14.761, abs=1e-5)
    assert round(hit_ceiling(W), 3) == 0.932
    spec = draw_session(W, 0, STREAM_BASE, 3)
    assert spec.prompt_tokens(W) == sum(2000 + 650 * (k - 1) for k in range(1, spec.n_turns + 1))


def test_tool_times_are_exponential_mean_5() -> None:
    z = np.concatenate([draw_session(W, 3, STREAM_BASE, i).tool_times for i in range(2000)])
    assert abs(z.mean() - 5.0) < 4 * 5.0 / math.sqrt(len(z))


# -------------------------------------------------------------------------------------------------
# common random numbers
# -------------------------------------------------------------------------------------------------
def test_top_process_prefix_does_not_depend_on_horizon() -> None:
    t1, m1 = top_process(0, 1000.0)
    t2, m2 = top_process(0, 9000.0)
    assert np.array_equal(t1, t2[: len(t1)]) and np.array_equal(m1, m2[: len(m1)])
    assert t2[len(t1)] >= 1000.0
    assert len(t2) == pytest.approx(TOP_RATE * 9000, rel=0.05)


def test_burst_draw_prefix() -> None:
    a = burst_offsets(1, BURST_DRAW, 60.0)
    for n in (1, 25, 40, 100, 200, 300):
        assert np.array_equal(burst_offsets(1, n, 60.0)[: min(n, BURST_DRAW)], a[: min(n, BURST_DRAW)])
    assert ((a >= 0) & (a < 60.0)).all()


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lo=st.floats(0.5, 3.0), hi=st.floats(0.5, 3.0))
def test_lower_rate_is_a_subset_and_ith_session_is_identical(seed: int, lo: float, hi: float) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    a = make_plan(W, SHORT, ARMS["noburst"], lo, LREF, seed)
    b = make_plan(W, SHORT, ARMS["noburst"], hi, LREF, seed)
    ta, tb = [s.arrival for s in _base(a)], {s.arrival for s in _base(b)}
    assert set(ta) <= tb
    for sa, sb in zip(_base(a), _base(b)):  # the i-th arriving session, whatever its arrival time
        assert (sa.index, sa.n_turns, sa.tool_times, sa.token_seed) == (
            sb.index,
            sb.n_turns,
            sb.tool_times,
            sb.token_seed,
        )


def test_nesting_works_on_absolute_rates_across_cells() -> None:
    vllm = make_plan(W, E2, ARMS["burst"], 1.35, 0.06566, 0)  # 0.0886 sessions/s
    sglang = make_plan(W, E2, ARMS["burst"], 1.35, LREF, 0)  # 0.0966 sessions/s
    assert {s.arrival for s in _base(vllm)} <= {s.arrival for s in _base(sglang)}
    assert [s.n_turns for s in _base(vllm)] == [s.n_turns for s in _base(sglang)][: len(_base(vllm))]


def test_burst_is_identical_everywhere_and_a_burst_of_n_takes_the_first_n() -> None:
    ref = _burst(make_plan(W, E2, ARMS["burst"], 1.35, LREF, 2))
    assert len(ref) == 200
    assert all(1200.0 <= s.arrival < 1260.0 for s in ref)
    for rate, lam in ((1.65, LREF), (2.0, 0.194), (1.35, 0.0596)):
        assert _burst(make_plan(W, E2, ARMS["burst"], rate, lam, 2)) == ref
    for n in (25, 40, 50, 60, 100):
        arm = ARMS["burst"].model_copy(update={"burst_size": n})
        assert _burst(make_plan(W, E2, arm, 1.65, LREF, 2)) == ref[:n]
    assert _burst(make_plan(W, E2, ARMS["burst"], 1.35, LREF, 1)) != ref  # seeds differ


def test_client_policies_do_not_change_the_plan() -> None:
    burst = plan_bytes(make_plan(W, E2, ARMS["burst"], 1.35, LREF, 0))
    assert plan_bytes(make_plan(W, E2, ARMS["capped"], 1.35, LREF, 0)) == burst
    assert plan_bytes(make_plan(W, E2, ARMS["rescue-r1"], 1.35, LREF, 0)) == burst
    noburst = plan_bytes(make_plan(W, E2, ARMS["noburst"], 1.35, LREF, 0))
    assert plan_bytes(make_plan(W, E2, ARMS["toolslow-d30"], 1.35, LREF, 0)) == noburst
    assert plan_bytes(make_plan(W, E2, ARMS["toolslow-w"], 1.35, LREF, 0)) == noburst
    b, nb = make_plan(W, E2, ARMS["burst"], 1.35, LREF, 0), make_plan(W, E2, ARMS["noburst"], 1.35, LREF, 0)
    assert _base(b) == _base(nb)  # NOBURST = the BURST plan without its burst sessions


def test_cut_thins_the_same_marks_after_its_start() -> None:
    full = make_plan(W, E2, ARMS["burst"], 1.65, LREF, 1)
    for arm, rate in (("cut-a115", 1.15), ("cut-b085", 0.85)):
        cut = make_plan(W, E2, ARMS[arm], 1.65, LREF, 1)
        before = [s for s in _base(cut) if s.arrival < 2400.0]
        assert before == [s for s in _base(full) if s.arrival < 2400.0]
        after = {s.arrival for s in _base(cut) if s.arrival >= 2400.0}
        assert after <= {s.arrival for s in _base(full)}
        assert after == {
            s.arrival for s in _base(make_plan(W, E2, ARMS["burst"], rate, LREF, 1)) if s.arrival >= 2400.0
        }
        assert _burst(cut) == _burst(full)
        assert cut.expected_arrivals(0.0, 8700.0) == pytest.approx(LREF * (1.65 * 2400 + rate * 6300))


def test_cut_above_the_run_rate_is_refused() -> None:
    # a cut only thins: at run rate 1.0 a cut "to" 1.15 would change no arrival while the plan's
    # nominal rate (and so its rate report and KS test) claimed 1.15 after the cut
    with pytest.raises(PlanError, match=r"cut\.rate: got 1\.15 x lambda_ref; expected at most the run's rate 1\.0"):
        make_plan(W, E2, ARMS["cut-a115"], 1.0, LREF, 0)
    make_plan(W, E2, ARMS["cut-a115"], 1.15, LREF, 0)  # equal: allowed (no change)


def test_shed_flags_arrivals_in_its_window_and_keeps_identities() -> None:
    full = make_plan(W, E2, ARMS["burst"], 1.35, LREF, 0)
    shed = make_plan(W, E2, ARMS["shed-t600"], 1.35, LREF, 0)
    assert len(shed.sessions) == len(full.sessions)
    for a, b in zip(full.sessions, shed.sessions):
        assert (a.stream, a.index, a.arrival, a.n_turns, a.token_seed) == (
            b.stream,
            b.index,
            b.arrival,
            b.n_turns,
            b.token_seed,
        )
        assert b.refused == (1800.0 <= b.arrival < 2400.0)
    assert shed.meta["counts"]["refused"] == sum(s.refused for s in shed.sessions) > 0


def test_mirror_is_a_transform_of_the_same_draw() -> None:
    std = make_plan(W, E2, ARMS["burst"], 1.65, LREF, 0)
    mir = make_plan(MIRROR, E2, ARMS["burst"], 1.65, LREF, 0)
    assert [(s.arrival, s.token_seed) for s in std.sessions] == [(s.arrival, s.token_seed) for s in mir.sessions]
    for a, b in zip(std.sessions, mir.sessions):
        k = min(a.n_turns, b.n_turns) - 1
        assert a.tool_times[:k] == b.tool_times[:k]
        assert a.u_turns == b.u_turns and b.n_turns == turn_count(b.u_turns, 1000.0, 20)
    assert np.mean([s.n_turns for s in mir.sessions]) > 19


def test_rate_above_top_rate_is_refused_clearly() -> None:
    with pytest.raises(PlanError, match=r"exceeds the plan's top rate of 2 sessions/s"):
        make_plan(W, E2, ARMS["burst"], 30.0, LREF, 0)
    with pytest.raises(PlanError, match="seed"):
        make_plan(W, E2, ARMS["burst"], 1.35, LREF, -1)
    with pytest.raises(PlanError, match="lambda_ref"):
        make_plan(W, E2, ARMS["burst"], 1.35, 0.0, 0)


def test_top_rate_is_part_of_the_plan_and_lifts_the_ceiling(tmp_path: Path) -> None:
    # A CPU cell serves ~14 sessions/s: above the paper's 2.0 base stream it cannot be planned ...
    lam = 9.45
    with pytest.raises(PlanError, match=r"top_rate' of at least 12\.76"):
        make_plan(W, SHORT, ARMS["burst"], 1.35, lam, 0)
    # ... and with a registered top rate it can, nested across rates at that top rate.
    lo = make_plan(W, SHORT, ARMS["noburst"], 1.35, lam, 0, top_rate=40.0)
    hi = make_plan(W, SHORT, ARMS["noburst"], 2.85, lam, 0, top_rate=40.0)
    assert lo.meta["top_rate"] == 40.0 and lo.top_rate == 40.0
    assert {s.arrival for s in _base(lo)} <= {s.arrival for s in _base(hi)}
    assert len(_base(lo)) == pytest.approx(1.35 * lam * SHORT.duration, rel=0.05)
    # the top rate is identity: regenerate() rebuilds it from the file alone
    write_plan(lo, tmp_path / "p.parquet")
    assert plan_bytes(regenerate(read_plan(tmp_path / "p.parquet"))) == (tmp_path / "p.parquet").read_bytes()
    # another top rate is another base stream: same rate, different arrivals
    other = make_plan(W, SHORT, ARMS["noburst"], 1.35, lam, 0, top_rate=20.0)
    assert [s.arrival for s in _base(other)] != [s.arrival for s in _base(lo)]
    with pytest.raises(PlanError, match="top_rate"):
        make_plan(W, SHORT, ARMS["noburst"], 1.35, LREF, 0, top_rate=0.0)


def test_default_top_rate_keeps_plans_byte_identical() -> None:
    # The top rate was a constant (2.0) before it was a parameter, already written into each plan's
    # metadata: the default must give the same bytes, and a plan at 2.0 the same base stream.
    explicit = make_plan(W, E2, ARMS["burst"], 1.35, LREF, 0, top_rate=2.0)
    assert plan_bytes(explicit) == plan_bytes(make_plan(W, E2, ARMS["burst"], 1.35, LREF, 0))
    assert explicit.meta["top_rate"] == 2.0 and TOP_RATE == 2.0
    t, m = top_process(0, E2.duration)
    keep = t[m < 1.35 * LREF / 2.0]
    assert np.array_equal(keep, np.array([s.arrival for s in _base(explicit)]))


def _list_built_bytes(plan) -> bytes:
    """The plan file as plan_bytes built it before issue 24: every column from a Python list."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from harness.workload import planfile

    s = plan.sessions
    table = pa.table(
        {
            "kind": pa.array([x.kind for x in s], pa.string()),
            "stream": pa.array([x.stream for x in s], pa.int32()),
            "index": pa.array([x.index for x in s], pa.int32()),
            "arrival": pa.array([x.arrival for x in s], pa.float64()),
            "n_turns": pa.array([x.n_turns for x in s], pa.int32()),
            "tool_times": pa.array([list(x.tool_times) for x in s], pa.list_(pa.float64())),
            "token_seed": pa.array([x.token_seed for x in s], pa.int64()),
            "refused": pa.array([x.refused for x in s], pa.bool_()),
        },
        schema=planfile._SCHEMA.with_metadata({planfile.META_KEY: planfile._canonical(plan.meta)}),
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", compression_level=3, use_dictionary=["kind"], version="2.6")
    return sink.getvalue()


@pytest.mark.parametrize(
    "workload, arm, rate",
    [(W, "burst", 1.35), (W, "shed-t600", 1.65), (W, "cut-a115", 1.65), (MIRROR, "noburst", 1.35)],
)
def test_plan_bytes_are_those_of_the_list_built_table(workload, arm, rate) -> None:
    """plan_bytes hands pyarrow numpy arrays (no pandas import); the file is byte for byte the one the
    lists gave: every registered plan hash rests on it. The cases cover refused flags (shed), a cut,
    and the mirror's tool times."""
    plan = make_plan(workload, E2, ARMS[arm], rate, LREF, 0)
    assert plan_bytes(plan) == _list_built_bytes(plan)
    empty = dataclasses.replace(plan, sessions=())  # no session: zero-length columns and offsets [0]
    assert plan_bytes(empty) == _list_built_bytes(empty)


def test_writing_a_plan_does_not_import_pandas() -> None:
    code = (
        "import sys\nfrom harness.config import load_config, WorkloadConfig, ProtocolConfig, ArmConfig\n"
        "from harness.workload.plans import make_plan\nfrom harness.workload.planfile import plan_bytes\n"
        "p = make_plan(load_config('workloads/standard', WorkloadConfig), load_config('protocols/e2', "
        "ProtocolConfig), load_config('arms/burst', ArmConfig), 1.35, 0.071534, 0)\n"
        "plan_bytes(p)\nprint('pandas' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip().splitlines()[-1] == "False", r.stdout


# -------------------------------------------------------------------------------------------------
# files and hashes
# -------------------------------------------------------------------------------------------------
def test_write_read_roundtrip_and_regenerate(tmp_path: Path) -> None:
    plan = make_plan(W, E2, ARMS["shed-t600"], 1.35, LREF, 1)
    digest = write_plan(plan, tmp_path / "p.parquet")
    assert digest == hashlib.sha256((tmp_path / "p.parquet").read_bytes()).hexdigest()
    back = read_plan(tmp_path / "p.parquet")
    assert back.sha256 == digest and back.meta == plan.meta and back.sessions == plan.sessions
    assert back.workload == W.model_copy(update={"description": ""}) and back.protocol.name == "e2"
    assert plan_bytes(regenerate(back)) == (tmp_path / "p.parquet").read_bytes()
    assert [s.kind for s in back.sessions[:3]] == ["base"] * 3


_CHILD = """
import sys
from harness.config import load_config, WorkloadConfig, ProtocolConfig, ArmConfig
from harness.workload.plans import make_plan
from harness.workload.planfile import write_plan
p = make_plan(load_config('workloads/standard', WorkloadConfig), load_config('protocols/e2', ProtocolConfig),
              load_config('arms/burst', ArmConfig), 1.65, 0.071534, 2)
print(write_plan(p, sys.argv[1]))
"""


def test_plans_are_byte_identical_across_processes(tmp_path: Path) -> None:
    outs = []
    for i, hashseed in enumerate(("0", "12345")):
        env = {"PYTHONHASHSEED": hashseed, "PATH": "/usr/bin:/bin"}
        r = subprocess.run(
            [sys.executable, "-c", _CHILD, str(tmp_path / f"{i}.parquet")],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        outs.append(r.stdout.strip())
    assert outs[0] == outs[1]
    a, b = (tmp_path / "0.parquet").read_bytes(), (tmp_path / "1.parquet").read_bytes()
    assert a == b
    here = plan_bytes(make_plan(W, E2, ARMS["burst"], 1.65, LREF, 2))
    assert here == a and hashlib.sha256(here).hexdigest() == outs[0]


def test_read_plan_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        read_plan(tmp_path / "missing.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(PlanError, match="not a Parquet plan"):
        read_plan(tmp_path / "junk.parquet")


# -------------------------------------------------------------------------------------------------
# realized arrivals
# -------------------------------------------------------------------------------------------------
def test_rate_report_counts_and_nominal() -> None:
    plan = make_plan(W, E2, ARMS["burst"], 1.35, LREF, 1)
    rows = {r.label: r for r in rate_report(plan)}
    assert set(rows) >= {
        "before burst",
        "during burst",
        "burst to window",
        "evaluation window",
        "whole run",
        "burst sessions",
    }
    whole = rows["whole run"]
    assert whole.arrivals == plan.meta["counts"]["base"]
    assert whole.expected == pytest.approx(1.35 * LREF * 8700)
    assert (
        rows["before burst"].arrivals + rows["burst to window"].arrivals + rows["evaluation window"].arrivals
        == whole.arrivals
    )
    assert rows["burst sessions"].arrivals == 200 and rows["burst sessions"].deviation == 0
    ev = rows["evaluation window"]
    assert ev.deviation == pytest.approx(ev.arrivals / (1.35 * LREF * 3000) - 1)
    assert ev.z == pytest.approx((ev.arrivals - ev.expected) / math.sqrt(ev.expected))
    cut = make_plan(W, E2, ARMS["cut-b085"], 1.65, LREF, 1)
    assert "after cut" in {r.label for r in rate_report(cut)}


def test_ks_test_does_not_reject_the_poisson_stream() -> None:
    pvals = [ks_exponential(make_plan(W, E2, ARMS["noburst"], 2.0, LREF, s)).pvalue for s in range(5)]
    assert min(pvals) > 1e-3
    cut = ks_exponential(make_plan(W, E2, ARMS["cut-b085"], 1.65, LREF, 0))
    assert cut.pvalue > 1e-3 and cut.n > 100
