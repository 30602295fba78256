"""Configs: the shipped files load, carry the paper's values, and every malformed class is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import (
    CONFIG_ROOT,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    TestConfig,
    WorkloadConfig,
    load_config,
    load_cost_file,
    load_test,
    parse_config,
)
from harness.errors import ConfigError
from harness.workload.draws import mean_turn_prompt

SHIPPED = sorted(p for p in CONFIG_ROOT.rglob("*.yaml") if p.parent.name not in ("costs", "rules"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIG_ROOT)))
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.name == path.stem


def test_required_configs_are_shipped() -> None:
    names = {str(p.relative_to(CONFIG_ROOT)) for p in SHIPPED}
    for n in (
        "workloads/standard.yaml",
        "workloads/mirror-k20.yaml",
        "protocols/e2.yaml",
        *(
            f"arms/{a}.yaml"
            for a in (
                "burst",
                "noburst",
                "capped",
                "toolslow-d30",
                "toolslow-w",
                "shed-t600",
                "shed-t3600",
                "cut-a115",
                "cut-b085",
                "rescue-r1",
            )
        ),
        *(
            f"cells/{c}.yaml"
            for c in (
                "sglang-a100-300k",
                "sglang-a100-150k",
                "sglang-a100-600k",
                "sglang-a100-native",
                "vllm-a100-300k",
                "llama-a100-300k",
                "sglang-h200-300k",
                "sglang-h200-600k",
            )
        ),
        "tests/e2-sglang-300k.yaml",
    ):
        assert n in names, n


def test_standard_workload_values() -> None:
    w = load_config("workloads/standard", WorkloadConfig)
    assert (w.first_prompt, w.tool_tokens, w.decode_tokens) == (2000, 550, 100)
    assert (w.turns.mean, w.turns.cap, w.tool_time.mean) == (15.0, 60, 5.0)
    assert [w.prompt_len(k) for k in (1, 2, 3, 60)] == [2000 + 650 * (k - 1) for k in (1, 2, 3, 60)]
    m = load_config("workloads/mirror-k20", WorkloadConfig)
    assert (m.turns.mean, m.turns.cap) == (1000.0, 20)
    assert m.model_dump(exclude={"name", "description", "turns"}) == w.model_dump(
        exclude={"name", "description", "turns"}
    )


def test_protocol_and_test_values() -> None:
    p = load_config("protocols/e2", ProtocolConfig)
    assert (p.duration, p.burst.time, p.burst.size, p.burst.width) == (8700.0, 1200.0, 200, 60.0)
    assert (p.window.start, p.window.end, p.backlog_bin) == (5700.0, 8700.0, 10.0)
    b = load_test("tests/e2-sglang-300k")
    assert b.test.arms == ["burst", "noburst", "capped"] and b.test.rates == [1.35, 1.65] and b.test.seeds == [0, 1, 2]
    assert b.arms["capped"].gate_cap(b.test.cap) == 20
    assert b.arms["burst"].gate_cap(b.test.cap) is None
    assert b.cell.name == "sglang-a100-300k" and b.protocol.name == "e2"


def test_cell_values() -> None:
    c = {p.stem: load_config(p, CellConfig) for p in (CONFIG_ROOT / "cells").glob("*.yaml")}
    assert c["sglang-a100-300k"].lambda_ref == pytest.approx(0.0715, abs=1e-4)
    assert c["sglang-a100-300k"].all_miss_token_rate == 11243
    assert c["sglang-a100-native"].kv_pool_tokens == 955757 and c["sglang-a100-native"].lambda_ref == 0.0718
    assert c["sglang-a100-native"].all_miss_token_rate == 11282
    assert c["sglang-a100-150k"].kv_pool_tokens == 150000 and c["sglang-a100-600k"].kv_pool_tokens == 600000
    assert c["sglang-a100-150k"].lambda_ref == c["sglang-a100-300k"].lambda_ref  # the 300k value of their GPU
    v = c["vllm-a100-300k"]
    assert (v.engine.name, v.page_size, v.batching, v.waiting_prefix_refresh) == ("vllm", 16, "mixed", False)
    assert v.kv_pool_tokens // v.page_size == 18750
    assert (
        v.cost.token_factor == 1.0882
        and v.lambda_ref == pytest.approx(0.0657, abs=1e-4)
        and v.all_miss_token_rate == 10349
    )
    assert c["sglang-h200-300k"].cost.speed == 2.742 and c["sglang-h200-300k"].lambda_ref == 0.194
    assert c["sglang-h200-600k"].kv_pool_tokens == 600000 and c["sglang-h200-600k"].cost.speed == 2.742
    assert c["llama-a100-300k"].lambda_ref == 0.0596 and "Llama-3.1-8B" in c["llama-a100-300k"].model
    cpu = c.pop("vllm-cpu-tiny-131k")  # the scaled CPU cell: its own settings (the notes)
    assert (cpu.kv_pool_tokens, cpu.page_size, cpu.max_running, cpu.context_length) == (131072, 32, 64, 8192)
    from analysis.calibration_summaries import (
        e0a_values,
        load_inputs,
    )  # its references are its registered E0a's  # its references are its registered E0a's

    e0a = e0a_values(load_inputs(CONFIG_ROOT.parent / "prereg" / "inputs" / cpu.name).e0a, cpu.name)
    assert (cpu.lambda_ref, cpu.all_miss_token_rate, cpu.engine.version) == (
        e0a.lambda_ref,
        e0a.all_miss_token_rate,
        "0.32.0",
    )
    sg = c.pop("sglang-cpu-tiny-32k")  # the CPU SGLang cell: the real-SGLang tests' cell, no E0a yet
    assert (sg.kv_pool_tokens, sg.page_size, sg.max_running, sg.context_length) == (32768, 1, 16, 8192)
    assert (sg.device, sg.mem_fraction_static, sg.attention_backend, sg.engine.version) == (
        "cpu",
        0.5,
        "torch_native",
        "0.5.22",
    )
    assert sg.lambda_ref is None and sg.all_miss_token_rate is None
    sg16 = c.pop("sglang-cpu-tiny-16k")  # the speed-pinned CPU SGLang cell of the trap run (docs/sglang-cpu-trap.md)
    assert (sg16.kv_pool_tokens, sg16.page_size, sg16.max_running, sg16.context_length) == (16384, 1, 8, 8192)
    assert sg16.model_dump(include={"device", "mem_fraction_static", "attention_backend", "engine"}) == (
        sg.model_dump(include={"device", "mem_fraction_static", "attention_backend", "engine"})
    )
    pin16 = sg16.engine_speed_pin
    assert pin16 is not None and sg16.engine_cpu_quota is not None
    assert pin16.min_cpu_quota <= sg16.engine_cpu_quota <= pin16.max_cpu_quota < 2 and pin16.tolerance < 0.15
    assert "--sleep-on-idle" in sg16.launch_extras  # an idle SGLang scheduler otherwise spins a core
    from analysis.calibration_summaries import E0a, load_summary

    e0a16_file = load_summary(CONFIG_ROOT.parent / "prereg" / "inputs" / sg16.name / "e0a.yaml", "e0a")
    assert isinstance(e0a16_file, E0a)  # calibrated stage by stage: an E0a, no E0b yet
    e0a16 = e0a_values(e0a16_file, sg16.name)
    assert (sg16.lambda_ref, sg16.all_miss_token_rate) == (e0a16.lambda_ref, e0a16.all_miss_token_rate)
    pinned = c.pop(
        "vllm-cpu-tiny-65k"
    )  # the speed-pinned CPU cell: its speed, not its share (harness/servers/speedpin.py)
    assert (pinned.kv_pool_tokens, pinned.page_size, pinned.max_running, pinned.context_length) == (65536, 32, 32, 8192)
    pin = pinned.engine_speed_pin
    assert (
        pin is not None
        and pinned.engine_cpu_quota is not None
        and pin.min_cpu_quota <= pinned.engine_cpu_quota <= pin.max_cpu_quota
    )
    assert (
        pin.max_cpu_quota < 2 and pin.tolerance < 0.15
    )  # leaves the client a core's share; well inside the rule's token tolerance
    e0a = e0a_values(load_inputs(CONFIG_ROOT.parent / "prereg" / "inputs" / pinned.name).e0a, pinned.name)
    assert (pinned.lambda_ref, pinned.all_miss_token_rate) == (
        e0a.lambda_ref,
        e0a.all_miss_token_rate,
    )  # calibrated under the pin
    # The cell for any host of this kind: the 65k cell in fp32, its pin's probe one turn of the
    # workload's mean prompt length (L_k averaged over the turns sent, P(T >= k)), its references its
    # own E0a under that pin.
    anyhost = c.pop("vllm-cpu-tiny-65k-fp32")
    differ = {"name", "description", "gpu", "launch_extras", "engine_cpu_quota", "engine_speed_pin"}
    differ |= {"lambda_ref", "all_miss_token_rate"}
    assert anyhost.model_dump(exclude=differ) == pinned.model_dump(exclude=differ)
    assert anyhost.launch_extras == [x if x != "bfloat16" else "float32" for x in pinned.launch_extras or []]
    apin = anyhost.engine_speed_pin
    assert apin is not None and anyhost.engine_cpu_quota is not None
    assert apin.min_cpu_quota <= anyhost.engine_cpu_quota <= apin.max_cpu_quota < 2 and apin.tolerance < 0.15
    workload = load_config(CONFIG_ROOT / "workloads" / "cpu-scaled.yaml", WorkloadConfig)
    assert apin.prompt_tokens == round(mean_turn_prompt(workload))
    e0a_any = e0a_values(load_inputs(CONFIG_ROOT.parent / "prereg" / "inputs" / anyhost.name).e0a, anyhost.name)
    assert (anyhost.lambda_ref, anyhost.all_miss_token_rate) == (e0a_any.lambda_ref, e0a_any.all_miss_token_rate)
    for name in ("vllm-cpu-tiny-65k-fitted", "vllm-cpu-tiny-65k-fit2"):  # the cell with each of its fitted costs
        pfit = c.pop(name)
        assert pfit.cost_file and pfit.model_dump(exclude={"name", "description", "cost", "cost_file"}) == (
            pinned.model_dump(exclude={"name", "description", "cost", "cost_file"})
        )
    afit = c.pop("vllm-cpu-tiny-65k-fp32-fit")  # the fp32 cell with the cost its design and prediction ran on
    assert afit.cost_file == "../costs/vllm-cpu-tiny-65k-fp32-fit.yaml"
    assert afit.model_dump(exclude={"name", "description", "cost", "cost_file"}) == (
        anyhost.model_dump(exclude={"name", "description", "cost", "cost_file"})
    )
    fitted = c.pop("vllm-cpu-tiny-131k-fitted")  # the same cell with its fitted cost model (the simulator's prediction)
    same = {"name", "description", "cost", "cost_file"}
    assert (
        fitted.model_dump(exclude=same) == cpu.model_dump(exclude=same)
        and fitted.cost_file
        and fitted.cost.model().a != cpu.cost.model().a
    )
    for cell in c.values():  # the paper's cells
        assert (cell.chunked_prefill, cell.max_running, cell.schedule_policy) == (8192, 256, "fcfs")
        assert cell.cost.model().a == pytest.approx(9.24e-3)


def test_arm_values() -> None:
    a = {p.stem: load_config(p, ArmConfig) for p in (CONFIG_ROOT / "arms").glob("*.yaml")}
    assert not a["noburst"].burst and a["burst"].burst
    assert a["toolslow-d30"].toolslow.model_dump() == {"start": 1200.0, "end": 2100.0, "delta": 30.0}
    assert a["toolslow-w"].toolslow.model_dump() == {"start": 1200.0, "end": 3000.0, "delta": 30.0}
    assert (a["shed-t600"].shed.start, a["shed-t600"].shed.duration) == (1800.0, 600.0)
    assert a["shed-t3600"].shed.duration == 3600.0
    assert (a["cut-a115"].cut.start, a["cut-a115"].cut.rate, a["cut-b085"].cut.rate) == (2400.0, 1.15, 0.85)
    g = a["rescue-r1"].gate
    assert (g.kind, g.cap, g.t_on, g.release_hold, g.release_min_after, g.release_tick) == (
        "rescue",
        20,
        1800.0,
        300.0,
        600.0,
        10.0,
    )
    with pytest.raises(ConfigError, match="no test cap"):
        a["capped"].gate_cap(None)


# -------------------------------------------------------------------------------------------------
# malformed files: each class of mistake names file, field path, value and expectation
# -------------------------------------------------------------------------------------------------
def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


WORKLOAD = "kind: workload\nname: w\n"
CELL = "kind: cell\nname: c\nengine: {name: sglang, version: '0.5.22'}\nmodel: m\ngpu: g\nkv_pool_tokens: 300000\n"


@pytest.mark.parametrize(
    "text, fragments",
    [
        (WORKLOAD + "turns: {mean: 15.0, cap: 60, capp: 3}\n", ["turns.capp", "unknown key", "3"]),
        (WORKLOAD + "tool_tokns: 550\n", ["tool_tokns", "unknown key", "550"]),
        (WORKLOAD + "turns: {mean: 15.0, cap: '60'}\n", ["turns.cap", "'60'", "expected a valid integer"]),
        (WORKLOAD + "turns: {mean: 15.0, cap: 60.0}\n", ["turns.cap", "60.0", "expected a valid integer"]),
        (WORKLOAD + "turns: {mean: 0.5}\n", ["turns.mean", "0.5", "greater than 1"]),
        (WORKLOAD + "turns: {cap: 100}\n", ["turns.cap", "100", "less than or equal to 64"]),
        (WORKLOAD + "turns: {law: poisson}\n", ["turns.law", "'poisson'", "capped_geometric"]),
        (WORKLOAD + "token_ids: {low: 10, high: 5}\n", ["token_ids", "high > low", "low 10", "high 5"]),
        ("kind: workload\n", ["name", "required field is missing"]),
        ("kind: workloads\nname: w\n", ["kind", "'workloads'"]),
        (CELL + "engine: {name: tgi, version: '1'}\n", ["duplicate key 'engine'", "line 7"]),
        (CELL.replace("sglang", "tgi"), ["engine.name", "'tgi'", "'sglang' or 'vllm'"]),
        (CELL + "kv_pool_tokens_x: 1\n", ["kv_pool_tokens_x", "unknown key"]),
        (CELL + "prefix_cache: 1\n", ["prefix_cache", "1", "valid boolean"]),
        (CELL + "cost: {a: -1.0}\n", ["cost.a", "-1.0", "greater than or equal to 0"]),
        (
            CELL + "cost: {speed: 2.0}\ncost_file: costs/sglang-a100.yaml\n",
            ["cost to equal the parameters of cost_file", "give only one"],
        ),
        (CELL + "cost_file: costs/nope.yaml\n", ["cost_file", "nope", "not found"]),
        (CELL.replace("sglang", "vllm") + "schedule_policy: lpm\n", ["'fcfs' on a vLLM cell"]),
        ("kind: protocol\nname: p\nwindow: {start: 8000.0, end: 7000.0}\n", ["window", "end > start", "start 8000.0"]),
        ("kind: protocol\nname: p\nduration: 3000.0\n", ["window.end <= duration", "8700.0", "3000.0"]),
        ("kind: protocol\nname: p\nwindow: {start: 8500.0, end: 8700.0}\n", ["min_window", "8500.0"]),
        ("kind: arm\nname: a\ntoolslow: {start: 10.0, end: 5.0, delta: 3.0}\n", ["toolslow", "end > start"]),
        ("kind: arm\nname: a\ngate: {kind: fifo, cap: 20}\n", ["gate.kind", "'fifo'", "'fifo_cap' or 'rescue'"]),
        ("kind: arm\nname: a\ngate: {kind: fifo_cap, cap: 0}\n", ["gate.cap", "0", "greater than or equal to 1"]),
        ("kind: arm\nname: a\nburst: false\nburst_size: 50\n", ["burst_size absent or 0", "50"]),
        ("kind: arm\nname: a\ncut: {start: 2400.0}\n", ["cut.rate", "required field is missing"]),
        (
            "kind: test\nname: t\ncell: c\nworkload: w\nprotocol: p\narms: [burst]\nrates: [1.35, -1.0]\nseeds: [0]\n",
            ["rates", "positive", "-1.0"],
        ),
        (
            "kind: test\nname: t\ncell: c\nworkload: w\nprotocol: p\narms: [burst]\nrates: [1.35]\nseeds: [0, 0]\n",
            ["distinct seeds", "[0, 0]"],
        ),
        (
            "kind: test\nname: t\ncell: c\nworkload: w\nprotocol: p\narms: []\nrates: [1.35]\nseeds: [0]\n",
            ["arms", "at least 1"],
        ),
    ],
)
def test_malformed_config_messages(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg
    for f in fragments:
        assert f in msg, f"{f!r} not in:\n{msg}"


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "kind: [unclosed\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"), WorkloadConfig)
    with pytest.raises(ConfigError, match="missing 'kind'"):
        load_config(_write(tmp_path, "name: w\n"))
    with pytest.raises(ConfigError, match=r"kind: got 'cell'; expected 'workload'"):
        load_config(_write(tmp_path, CELL), WorkloadConfig)
    with pytest.raises(ConfigError, match="kind: got 'workload'; expected 'cost'"):
        load_cost_file(_write(tmp_path, WORKLOAD))


def test_cost_file_fills_cost_and_resolves_relative_to_the_cell(tmp_path: Path) -> None:
    _write(tmp_path, "kind: cost\nname: x\na: 1e-3\nspeed: 2.0\n", "mycost.yaml")
    cell = load_config(_write(tmp_path, CELL + "cost_file: mycost.yaml\n"), CellConfig)
    assert cell.cost.a == 1e-3 and cell.cost.speed == 2.0 and cell.cost_file == "mycost.yaml"
    with pytest.raises(ConfigError, match=r"(?s)cost_file 'typo\.yaml' to be a readable.*b_typo: unknown key"):
        _write(tmp_path, "kind: cost\nb_typo: 1.0\n", "typo.yaml")
        load_config(_write(tmp_path, CELL + "cost_file: typo.yaml\n", "c2.yaml"), CellConfig)


def test_test_bundle_requires_a_cap_for_capless_gates(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "kind: test\nname: t\ncell: sglang-a100-300k\nworkload: standard\nprotocol: e2\n"
        "arms: [burst, capped]\nrates: [1.35]\nseeds: [0]\n",
        "t.yaml",
    )
    with pytest.raises(ConfigError, match=r"t\.yaml: cap: .*gate\.cap is absent"):
        load_test(tmp_path / "t.yaml")


def test_parse_config_in_memory_is_strict_too() -> None:
    with pytest.raises(ConfigError, match=r"(?s)<memory>.*turns\.cap"):
        parse_config({"name": "w", "turns": {"cap": "60"}}, WorkloadConfig)
    # programmatic construction stays lax for code (not files)
    assert WorkloadConfig(name="w").turns.cap == 60
    assert TestConfig.__test__ is False


def test_a_dumped_cell_parses_again_anywhere() -> None:
    cell = load_config("cells/vllm-a100-300k", CellConfig)
    dumped = cell.model_dump(mode="json")
    assert parse_config(dumped, CellConfig) == cell  # file readable: inline values match it
    dumped["cost_file"] = "costs/not-on-this-machine.yaml"
    assert parse_config(dumped, CellConfig).cost == cell.cost  # file absent: the record stands alone


_FAST_TEST = (
    "kind: test\nname: fast\ncell: sglang-a100-300k\nworkload: standard\nprotocol: e2\narms: [burst]\nseeds: [0]\n"
)


def test_rates_above_the_top_rate_are_refused_when_the_test_loads(tmp_path: Path) -> None:
    # sglang-a100-300k: lambda_ref 0.071534, so 30 x lambda_ref = 2.15 sessions/s > the default 2.0
    _write(tmp_path, _FAST_TEST + "rates: [1.35, 30.0]\n", "t.yaml")
    with pytest.raises(
        ConfigError, match=r"t\.yaml: rates\[1\]: 30 x lambda_ref .* exceeds the plan's top rate of 2 sessions/s"
    ):
        load_test(tmp_path / "t.yaml")
    # a registered top rate lifts the ceiling; the default stays the paper's 2.0
    _write(tmp_path, _FAST_TEST + "rates: [1.35, 30.0]\ntop_rate: 4.0\n", "t2.yaml")
    assert load_test(tmp_path / "t2.yaml").test.top_rate == 4.0
    assert load_test("tests/e2-sglang-300k").test.top_rate == 2.0
    # a CUT arm that would raise the rate is refused at load too, not in its runs
    _write(tmp_path, "kind: arm\nname: cut-hi\nburst: true\ncut: {start: 100.0, rate: 1.5}\n", "cut-hi.yaml")
    _write(tmp_path, _FAST_TEST.replace("[burst]", "[cut-hi.yaml]") + "rates: [1.35, 1.65]\n", "t3.yaml")
    with pytest.raises(ConfigError, match=r"arm 'cut-hi': cut\.rate 1\.5 x lambda_ref is above the test's rate 1\.35"):
        load_test(tmp_path / "t3.yaml")


def test_arms_given_by_file_are_keyed_by_their_own_name(tmp_path: Path) -> None:
    arms = CONFIG_ROOT / "arms"
    _write(tmp_path, (arms / "capped.yaml").read_text(), "capped.yaml")  # beside the test, as a user keeps them
    _write(
        tmp_path,
        _FAST_TEST.replace("[burst]", f"[{arms / 'burst.yaml'}, noburst, capped.yaml]") + "rates: [1.35]\ncap: 20\n",
        "t.yaml",
    )
    b = load_test(tmp_path / "t.yaml")
    assert list(b.arms) == ["burst", "noburst", "capped"]
    assert b.arm_refs == {"burst": str(arms / "burst.yaml"), "noburst": "noburst", "capped": "capped.yaml"}
    # two references to arms of one name cannot both be recorded under it
    _write(tmp_path, _FAST_TEST.replace("[burst]", f"[burst, {arms / 'burst.yaml'}]") + "rates: [1.35]\n", "t2.yaml")
    with pytest.raises(ConfigError, match=r"arms\[1\]: .* is an arm named 'burst', like 'burst'"):
        load_test(tmp_path / "t2.yaml")


# -------------------------------------------------------------------------------------------------
# the scaled CPU cell: its protocol and rule are the paper's, scaled together
# -------------------------------------------------------------------------------------------------
K_TIME, K_POP = 50.0, 64 / 20  # times divided by k; the burst and population threshold times the cap ratio


def test_the_cpu_protocol_is_e2_with_every_time_scaled_by_one_factor() -> None:
    e2, cpu = load_config("protocols/e2", ProtocolConfig), load_config("protocols/e2-cpu", ProtocolConfig)

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

    assert times(cpu) == pytest.approx([t / K_TIME for t in times(e2)], rel=1e-12)
    assert cpu.burst.size == round(e2.burst.size * K_POP)


def test_the_cpu_rule_is_e2_with_its_time_and_population_parameters_scaled() -> None:
    from analysis.rules import load_rule

    cpu = load_rule(CONFIG_ROOT / "rules" / "e2-cpu.yaml")
    e2 = load_rule(None)
    assert e2 == load_rule("e2") and cpu["based_on"] == ["trap_states", "e2"]
    for k in ("states", "flags", "roles", "seed", "group", "test", "report", "family", "version"):
        assert cpu[k] == e2[k], k
    scaled = {
        "recovered_span": 1 / K_TIME,
        "backlog_bin": 1 / K_TIME,
        "min_window": 1 / K_TIME,
        "recovered_outstanding": K_POP,
    }
    assert set(cpu["params"]) == set(e2["params"])
    for k, v in e2["params"].items():
        assert cpu["params"][k] == (pytest.approx(v * scaled[k]) if k in scaled else v), k
    proto = load_config("protocols/e2-cpu", ProtocolConfig)
    assert (proto.min_window, proto.backlog_bin, proto.recovered_span) == tuple(
        cpu["params"][k] for k in ("min_window", "backlog_bin", "recovered_span")
    )


def test_the_pinned_cpu_rule_is_e2_cpu_with_the_population_threshold_of_its_running_cap() -> None:
    from analysis.rules import load_rule

    cpu, pinned = load_rule(CONFIG_ROOT / "rules" / "e2-cpu.yaml"), load_rule(CONFIG_ROOT / "rules" / "e2-cpu-65k.yaml")
    for k in ("states", "flags", "roles", "seed", "group", "test", "version"):
        assert pinned[k] == cpu[k], k
    assert {k: v for k, v in pinned["params"].items() if k != "recovered_outstanding"} == {
        k: v for k, v in cpu["params"].items() if k != "recovered_outstanding"
    }
    cell = load_config("cells/vllm-cpu-tiny-65k", CellConfig)
    paper_outstanding, paper_cap = 20, 20  # E2: RECOVERED needs fewer than 20 outstanding, with the paper's cap of 20
    assert pinned["params"]["recovered_outstanding"] == pytest.approx(paper_outstanding * cell.max_running / paper_cap)


def test_the_quarter_rule_is_the_pinned_rule_with_the_times_of_its_protocol() -> None:
    """e2-cpu-65k-quarter judges protocols/e2-cpu-quarter.yaml: its time parameters are that protocol's
    (RECOVERED's span kept at e2-cpu's 6 s), every other value is e2-cpu-65k's."""
    from analysis.rules import load_rule

    pinned = load_rule(CONFIG_ROOT / "rules" / "e2-cpu-65k.yaml")
    quarter = load_rule(CONFIG_ROOT / "rules" / "e2-cpu-65k-quarter.yaml")
    for k in ("states", "flags", "roles", "seed", "group", "test", "version"):
        assert quarter[k] == pinned[k], k
    times = ("min_window", "backlog_bin", "recovered_span")
    assert {k: v for k, v in quarter["params"].items() if k not in times} == {
        k: v for k, v in pinned["params"].items() if k not in times
    }
    proto, base = (
        load_config("protocols/e2-cpu-quarter", ProtocolConfig),
        load_config("protocols/e2-cpu", ProtocolConfig),
    )
    assert tuple(quarter["params"][k] for k in times) == (proto.min_window, proto.backlog_bin, proto.recovered_span)
    assert (proto.min_window, proto.backlog_bin, proto.hit_bin) == pytest.approx(
        (base.min_window * 0.25, base.backlog_bin * 0.25, base.hit_bin * 0.25)
    )
    assert proto.recovered_span == base.recovered_span  # kept: 1.5 s held too few turns to judge RECOVERED by
    assert proto.burst.time == pytest.approx(base.burst.time * 0.25)
    post, base_post = proto.duration - proto.burst.time, base.duration - base.burst.time
    assert post == pytest.approx(base_post * 0.25 * 3)
    assert (proto.window.start - proto.burst.time) / post == pytest.approx(
        (base.window.start - base.burst.time) / base_post
    )


def test_the_cpu_test_names_its_rule_and_plans_above_the_paper_top_rate() -> None:
    from analysis.calibration_summaries import load_inputs
    from prereg.registration import load_registration

    b = load_test("tests/e2-vllm-cpu")
    assert b.rule_path == CONFIG_ROOT / "rules" / "e2-cpu.yaml" and load_test("tests/e2-sglang-300k").rule_path is None
    assert max(b.test.rates) * b.cell.lambda_ref <= b.test.top_rate
    # the test is its registration's: rates, cap, top rate, references
    reg = load_registration(CONFIG_ROOT.parent / (b.test.registration or ""))
    assert (b.test.rates, b.test.cap, b.test.top_rate, b.test.start_lateness_p99) == (
        reg.multiples(),
        reg.cap,
        reg.top_rate,
        reg.start_lateness_p99,
    )
    assert (b.cell.lambda_ref, b.cell.all_miss_token_rate) == (
        reg.references.lambda_ref,
        reg.references.all_miss_token_rate,
    )
    assert b.arms["capped"].gate_cap(b.test.cap) == reg.cap
    # its E0b arrivals were thinned from the test's own base stream (40 sessions/s, above the paper's
    # 2.0: the cell's unthrottled calibration reached past 2.0, and the plans keep that stream)
    e0b = load_inputs(CONFIG_ROOT.parent / "prereg" / "inputs" / b.cell.name).e0b
    assert reg.top_rate > 2.0 and e0b.protocol.top_rate == reg.top_rate


def test_the_sglang_cpu_rule_and_protocol_are_e2_cpu_with_the_cap_burst_and_span_of_their_cell() -> None:
    """e2-cpu-sglang-16k judges protocols/e2-cpu-sglang.yaml on sglang-cpu-tiny-16k: e2-cpu's times,
    its population threshold scaled like the cell's running cap, RECOVERED's span the protocol's
    (longer, for the count of turns it holds); the protocol is e2-cpu's but for its burst and span."""
    from analysis.rules import load_rule

    cpu, sg = (
        load_rule(CONFIG_ROOT / "rules" / "e2-cpu.yaml"),
        load_rule(CONFIG_ROOT / "rules" / "e2-cpu-sglang-16k.yaml"),
    )
    for k in ("states", "flags", "roles", "seed", "group", "test"):
        assert sg[k] == cpu[k], k
    changed = ("recovered_outstanding", "recovered_span", "recheck_tolerance")
    assert {k: v for k, v in sg["params"].items() if k not in changed} == {
        k: v for k, v in cpu["params"].items() if k not in changed
    }
    # version 2: a run counts only if the pinned speed held to the end, within TRAPPED's token band
    assert sg["version"] == 2 and "recheck_tolerance" not in cpu["params"] and "run" not in cpu
    assert sg["params"]["recheck_tolerance"] == sg["params"]["rate_tolerance"]
    assert sg["run"] == {"count_if": ["isnan(pin_after) or abs(pin_after - 1) <= recheck_tolerance"]}
    cell = load_config("cells/sglang-cpu-tiny-16k", CellConfig)
    paper_outstanding, paper_cap = 20, 20
    assert sg["params"]["recovered_outstanding"] == pytest.approx(paper_outstanding * cell.max_running / paper_cap)
    proto, base = (
        load_config("protocols/e2-cpu-sglang", ProtocolConfig),
        load_config("protocols/e2-cpu", ProtocolConfig),
    )
    assert proto.recovered_span == sg["params"]["recovered_span"] > base.recovered_span
    assert proto.burst.size == 4 * cell.max_running
    same = {"name", "description", "burst", "recovered_span"}
    assert proto.model_dump(exclude=same) == base.model_dump(exclude=same)
    assert proto.burst.model_dump(exclude={"size"}) == base.burst.model_dump(exclude={"size"})
