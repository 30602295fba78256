"""Calibrating and registering a cell faster than the paper's: the scaled E0b protocol, the test's
top rate through E0b, the fill, the registration and its bound runs, and resuming a calibration.

Why these exist: the CPU vLLM cell runs ~10-30 sessions/s, so every plan it needs lies above the
paper's 2.0 sessions/s base stream, and every time of its protocol is fifty times shorter. Before
these fixes E0b could not plan a single run on it, a registration could not say which base stream
its plans came from (its plan hashes were of plans no job could make), and a calibration stage that
died on a shared machine had to start again from nothing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import yaml
from support.paths import REPO
from support.prereg_fixture import SHORT_PROTOCOL, template_text, write_case

from analysis.calibration_summaries import load_inputs, load_summary
from harness.config import CellConfig, ProtocolConfig, WorkloadConfig, load_config
from harness.errors import ConfigError, PlanError
from harness.recording.record import load_run
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan
from prereg.fill import fill_registration
from prereg.registration import dump_registration, load_registration, registration_from_data
from runs.calibration import calibrate_all
from runs.closed_runs import run_closed, stage_c
from runs.from_empty import e0b, e0b_protocol

K_TIME, K_POP = 50.0, 64 / 20  # as in tests/unit/harness/test_config.py: times / k, populations x the cap ratio

WL = WorkloadConfig(
    name="tiny",
    first_prompt=256,
    tool_tokens=64,
    decode_tokens=8,
    turns={"mean": 3.0, "cap": 5},
    tool_time={"mean": 0.2},
)


def fast_cell() -> CellConfig:
    """The CPU cell's engine settings in the simulator (the A100 cost model: only the mechanics matter)."""
    return load_config("cells/vllm-cpu-tiny-131k", CellConfig).model_copy(
        update={"kv_pool_tokens": 8192, "context_length": 4096}
    )


# -------------------------------------------------------------------------------------------------
# the scaled E0b protocol
# -------------------------------------------------------------------------------------------------
def test_the_cpu_e0b_protocol_is_e0b_with_every_time_scaled_by_the_e2_factor() -> None:
    e0b_cfg, cpu = load_config("protocols/e0b", ProtocolConfig), load_config("protocols/e0b-cpu", ProtocolConfig)

    def times(p: ProtocolConfig) -> list[float]:
        return [
            p.duration,
            p.burst.time,
            p.burst.width,
            p.window.start,
            p.window.end,
            p.min_window,
            p.backlog_bin,
            p.hit_bin,
            p.recovered_span,
        ]

    assert times(cpu) == pytest.approx([t / K_TIME for t in times(e0b_cfg)], rel=1e-12)
    assert cpu.burst.size == 0
    # the protocol e0b_protocol builds from it keeps its duration, window and bins
    p = e0b_protocol(base="e0b-cpu")
    assert (p.duration, p.window.start, p.window.end, p.backlog_bin) == (60.0, 30.0, 60.0, 0.2)
    assert e0b_protocol() == e0b_protocol(3000.0, 1500.0)  # the paper's, as before


def test_e0b_above_the_paper_top_rate_needs_the_test_top_rate() -> None:
    cell = fast_cell()
    with pytest.raises(PlanError, match="top_rate"):
        e0b(cell, WL, 9.45, grid=(1.0,), protocol="e0b-cpu")  # 9.45 sessions/s > the paper's 2.0
    (s,) = e0b(cell, WL, 9.45, grid=(1.0,), protocol="e0b-cpu", top_rate=40.0, duration=12.0, rise_span=6.0)
    assert s.duration == 12.0 and s.sessions > 0
    assert s.realized_multiple == pytest.approx(1.0, rel=0.5)


def test_calibrate_all_records_the_scaled_e0b_protocol_in_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "in"
    calibrate_all(
        fast_cell(),
        WL,
        out,
        ns=(4, 8),
        e0a_seeds=(0, 1),
        e0a_n=4,
        check_n=None,
        warmup=4.0,
        window=8.0,
        grid=(0.5, 3.0),
        e0b_protocol_ref="e0b-cpu",
        e0b_duration=12.0,
        rise_span=6.0,
        final_max=160.0,
        rise_max=32.0,
        top_rate=40.0,
    )
    eb = load_summary(out / "e0b.yaml", "e0b")
    assert eb.protocol.config == "e0b-cpu" and eb.protocol.bin_s == 0.2 and eb.protocol.top_rate == 40.0
    assert (eb.protocol.duration_s, eb.protocol.rise_span_s, eb.protocol.final_max) == (12.0, 6.0, 160.0)
    run = load_run(out / "runs" / "e0b-m3-s0")
    assert run.meta["plan"]["top_rate"] == 40.0 and run.meta["protocol"]["backlog_bin"] == 0.2
    # the paper's protocol keeps the summary's first form (no bins, top rate or config written)
    text = tmp_path / "paper.yaml"
    from analysis.calibration_summaries import e0b_summary_dict, write_summary

    write_summary(
        e0b_summary_dict(
            "c",
            [],
            lambda_ref=1.0,
            grid=[1.0],
            seeds=[0],
            duration=3000.0,
            rise_span=1500.0,
            final_max=50.0,
            rise_max=10.0,
            run_dirs=[],
            folder=tmp_path,
            source="",
        )
        | {"points": [{"multiple": 1.0, "seed": 0, "stable": True}]},
        text,
    )
    assert set(yaml.safe_load(text.read_text())["protocol"]) == {"duration_s", "rise_span_s", "final_max", "rise_max"}


# -------------------------------------------------------------------------------------------------
# resume
# -------------------------------------------------------------------------------------------------
def test_resume_summarises_a_matching_completed_run_and_reruns_nothing(tmp_path: Path) -> None:
    cell = fast_cell()
    first = stage_c(cell, WL, (4,), out_dir=tmp_path, warmup=4.0, window=8.0)
    meta = tmp_path / "stage-c-n4-s0" / "meta.json"
    before = (meta.read_bytes(), os.stat(meta).st_mtime_ns)
    again = stage_c(cell, WL, (4,), out_dir=tmp_path, warmup=4.0, window=8.0, resume=True)
    assert again == first
    assert (meta.read_bytes(), os.stat(meta).st_mtime_ns) == before  # summarised, not run again


def test_resume_does_not_take_a_run_of_other_settings(tmp_path: Path) -> None:
    from runs.closed_runs import completed_run

    cell = fast_cell()
    rd = tmp_path / "r"
    run_closed(cell, WL, 4, warmup=4.0, window=8.0, run_dir=rd)
    want = {"run_kind": "closed", "engine_kind": "sim", "population": 4, "seed": 0, "warmup": 4.0, "window": 8.0}
    assert completed_run(rd, cell, WL, want)
    assert completed_run(
        rd, cell.model_copy(update={"lambda_ref": 1.0, "description": "x"}), WL, want
    )  # references do not count
    assert not completed_run(rd, cell, WL, want | {"window": 9.0})
    assert not completed_run(rd, cell, WL, want | {"population": 5})
    assert not completed_run(rd, cell.model_copy(update={"max_running": 8}), WL, want)
    assert not completed_run(rd, cell, WL.model_copy(update={"tool_tokens": 65}), want)
    assert not completed_run(tmp_path / "none", cell, WL, want)
    m = rd / "meta.json"
    m.write_text(m.read_text().replace('"COMPLETED"', '"FAILED"'))
    assert not completed_run(rd, cell, WL, want)  # only a completed run is summarised


# -------------------------------------------------------------------------------------------------
# the registration of a fast cell
# -------------------------------------------------------------------------------------------------
def _fast_case(tmp_path: Path, top_rate: float | None) -> tuple[Path, Path]:
    """The paper's SGLang 300k inputs with lambda_ref scaled x 100 (a cell a hundred times faster)."""
    inputs, tmpl = write_case(tmp_path)

    def scale(d: object, keys: tuple[str, ...]) -> object:
        if isinstance(d, dict):
            return {k: (v * 100 if k in keys and isinstance(v, float) else scale(v, keys)) for k, v in d.items()}
        if isinstance(d, list):
            return [scale(x, keys) for x in d]
        return d

    for name, keys in (
        (
            "e0a.yaml",
            ("mu_sessions", "mu_turns", "lambda_ref", "lambda_ref_se", "lambda_sessions", "lambda_sessions_se"),
        ),
        ("stage-c.yaml", ("mu_sessions", "mu_turns")),
        ("e0b.yaml", ("lambda_ref",)),
    ):
        data = yaml.safe_load((inputs / name).read_text())
        (inputs / name).write_text(yaml.safe_dump(scale(data, keys), sort_keys=False))
    extra = "" if top_rate is None else f"top_rate: {top_rate}\nstart_lateness_p99: 0.05\n"
    tmpl.write_text(template_text(extra=extra))
    (tmpl.parent / "short.yaml").write_text(SHORT_PROTOCOL)
    return inputs, tmpl


def test_a_fast_cell_fills_only_with_a_top_rate_that_holds_its_rates(tmp_path: Path) -> None:
    inputs, tmpl = _fast_case(tmp_path / "a", None)
    res = fill_registration(inputs, tmpl, repo_root=tmp_path / "a")
    assert res.registration.status == "INCOMPLETE"
    assert any("top_rate" in r for r in res.registration.status_reasons), res.registration.status_reasons

    inputs, tmpl = _fast_case(tmp_path / "b", 40.0)
    reg = fill_registration(inputs, tmpl, repo_root=tmp_path / "b").registration
    assert reg.status == "FILLED", reg.status_reasons
    assert reg.top_rate == 40.0 and reg.start_lateness_p99 == 0.05
    lam = reg.references.lambda_ref
    assert lam > 2.0 and max(reg.multiples()) * lam <= 40.0
    # every registered plan hash is the plan a job makes at the registered top rate
    b = reg.bundle()
    assert b.test.top_rate == 40.0 and b.test.start_lateness_p99 == 0.05
    for p in reg.plans[:4]:
        plan = make_plan(b.workload, b.protocol, b.arms[p.arm], p.rate, lam, p.seed, b.test.top_rate)
        assert hashlib.sha256(plan_bytes(plan)).hexdigest() == p.sha256
    text = dump_registration(reg).decode()
    assert "top_rate: 40.0" in text and "start_lateness_p99: 0.05" in text
    # a file whose top rate cannot hold its rates is refused, naming the field
    data = yaml.safe_load(text)
    data["top_rate"] = 2.0
    with pytest.raises(ConfigError, match=r"rates\[0\]\.multiple: .*top_rate"):
        registration_from_data(data)


def test_every_registration_writes_its_top_rate_and_keeps_its_bytes() -> None:
    """The top rate is part of every plan's identity, so every registration states it (the paper's
    2.0 included) and reads back to the same bytes."""
    root = REPO
    for p in sorted((root / "prereg" / "registrations").glob("*.yaml")):
        reg = load_registration(p)
        assert f"top_rate: {reg.top_rate}" in p.read_text() and dump_registration(reg) == p.read_bytes(), p.name


# -------------------------------------------------------------------------------------------------
# a run made from a registration is bound to it
# -------------------------------------------------------------------------------------------------
def test_run_from_a_registration_records_its_binding(tmp_path: Path) -> None:
    from cli.main import main
    from prereg.registration import write_registration

    inputs, tmpl = write_case(tmp_path)
    reg = fill_registration(inputs, tmpl, repo_root=tmp_path).registration
    path = tmp_path / "reg.yaml"
    sha = write_registration(reg, path)
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--registration",
                str(path),
                "--arm",
                "noburst",
                "--rate",
                str(reg.multiples()[0]),
                "--seed",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    meta = load_run(out).meta
    assert meta["registration"]["sha256"] == sha and meta["registration"]["name"] == reg.name
    assert meta["registration"]["commit"] is None  # not committed: nothing decisive can come of it
    assert meta["plan"]["sha256"] == reg.plan_sha256("noburst", reg.multiples()[0], 0)
    assert meta["rule"] == reg.rule["name"]
    assert (
        main(["run", "--registration", str(path), "--config", "x.yaml", "--arm", "burst", "--rate", "1", "--seed", "0"])
        == 2
    )


def test_inputs_of_the_committed_cpu_calibration_load() -> None:
    root = REPO / "prereg" / "inputs"
    folders = sorted(p for p in root.glob("vllm-cpu-*") if p.is_dir())
    for f in folders:
        inp = load_inputs(f)
        assert (
            inp.e0b.protocol.config == "e0b-cpu" and inp.e0b.protocol.top_rate >= max(inp.e0b.grid) * inp.e0b.lambda_ref
        )


# -------------------------------------------------------------------------------------------------
# the host load a real run ran under
# -------------------------------------------------------------------------------------------------
def test_host_load_measures_the_cpu_share_of_a_process_group() -> None:
    import time

    from runs.realrun import HostLoad, group_cpu_seconds

    group = os.getpgid(0)
    assert group_cpu_seconds(group) is not None and group_cpu_seconds(group) >= 0
    assert group_cpu_seconds(2**22 + 12345) == 0.0  # no such group: nothing ran
    h = HostLoad()
    h.mark("drive_start", group)
    t = time.process_time()
    while time.process_time() - t < 0.3:  # burn a third of a CPU second in this group
        pass
    h.mark("drive_end", group)
    m = h.as_meta()
    assert m["cpus"] == os.cpu_count() and len(m["loadavg_drive_start"]) == 3
    assert m["engine_cpu_s"] >= 0.25 and 0 < m["engine_cpu_share"] <= (os.cpu_count() or 1) + 0.1


def test_a_stage_summary_says_the_load_its_real_runs_ran_under(tmp_path: Path) -> None:
    import json

    from runs.calibration import load_note

    dirs = []
    for i, (a, b, share) in enumerate(((3.0, 4.5, 0.61), (7.25, 6.0, 0.3))):
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "meta.json").write_text(
            json.dumps(
                {
                    "host_load": {
                        "cpus": 2,
                        "loadavg_drive_start": [a, 1, 1],
                        "loadavg_drive_end": [b, 1, 1],
                        "engine_cpu_share": share,
                    }
                }
            )
        )
        dirs.append(d)
    assert load_note(dirs) == "; host load (1 min) 3.0-7.2 on 2 CPUs, engine CPU share 0.30-0.61 of a core"
    sim = tmp_path / "sim"
    run_closed(fast_cell(), WL, 4, warmup=2.0, window=4.0, run_dir=sim)
    assert load_note([sim]) == ""  # a simulated run has no host load to report
