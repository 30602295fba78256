"""The harness side of the launch check (harness/servers/launchcheck.py) and the drivers' source scan,
without an engine: every cell's launch is built and its expectations come from the cell; mismatches,
absent series and device-limited series are reported; the scan finds counters, gauges and series
defined through a variable, with the device conditions around them. The engines' own parsers run in
tests/integration/test_engine_launches.py (markers vllm, sglang)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from harness.config import CONFIG_ROOT, CellConfig, load_config
from harness.servers.launchcheck import (
    DRIVERS,
    LaunchCheckError,
    build_case,
    cell_files,
    engine_args,
    mismatches,
    project_cases,
    series_problems,
    version_problems,
)
from harness.servers.metrics import SGLANG_RULES, VLLM_RULES, names_read, reads


def _scan_module():
    spec = importlib.util.spec_from_file_location("source_scan_under_test", DRIVERS / "source_scan.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_every_project_cell_has_a_launch_case_with_its_values() -> None:
    files = cell_files()
    assert len(files) >= 10
    cases = {e: project_cases(e)[0] for e in ("vllm", "sglang")}
    assert sum(len(c) for c in cases.values()) == len(files)
    gpu = {c.key: c for c in cases["sglang"]}["sglang-h200-300k"]
    argv = list(gpu.argv)
    assert (
        argv[argv.index("--max-total-tokens") + 1] == "300000" and argv[argv.index("--attention-backend") + 1] == "fa3"
    )
    assert (
        gpu.expected["max_total_tokens"] == 300000
        and gpu.expected["attention_backend"] == "fa3"
        and gpu.expected["device"] is None
    )
    cpu = {c.key: c for c in cases["vllm"]}["vllm-cpu-tiny-131k"]
    assert (
        cpu.argv[0] == "--model" and "--enforce-eager" in cpu.argv
    )  # past the CPU quota's wrapper, with the CPU extras
    assert cpu.expected["num_gpu_blocks_override"] == 4096 and cpu.expected["block_size"] == 32
    assert cpu.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_engine_args_needs_the_module() -> None:
    assert engine_args(["w", "--", "py", "-m", "mod", "--a", "1"], "mod") == ["--a", "1"]
    with pytest.raises(LaunchCheckError, match="does not run `-m mod`"):
        engine_args(["py", "serve", "--a"], "mod")


def test_a_parsed_value_other_than_the_cells_is_a_mismatch() -> None:
    cell = CONFIG_ROOT / "cells" / "vllm-a100-300k.yaml"
    case = build_case(cell)
    parsed = dict(case.expected, served_model_name=[case.expected["served_model_name"]])  # vLLM's list form is the same
    assert mismatches(case.expected, parsed) == []
    other = build_case(cell, expect_from=load_config(CONFIG_ROOT / "cells" / "vllm-cpu-tiny-131k.yaml", CellConfig))
    bad = mismatches(other.expected, parsed)
    assert any(m.startswith("num_gpu_blocks_override: the cell says 4096") for m in bad), bad
    assert any(m.startswith("block_size") for m in bad)
    assert mismatches({"page_size": 1}, {}) == ["page_size: the cell says 1, the engine parsed '<absent>'"]


def test_every_gauge_rule_declares_what_it_reads() -> None:
    for rules in (VLLM_RULES, SGLANG_RULES):
        declared = names_read(rules)
        assert set(declared) == set(rules)
        assert all(n.split(":")[0] in ("vllm", "sglang") for names in declared.values() for n in names)
    assert names_read(VLLM_RULES)["kv_usage_frac"] == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    with pytest.raises(TypeError, match="does not declare"):
        names_read({"running": lambda s, o: None})
    assert reads("x:y")(lambda s, o: None).reads == ("x:y",)


def test_series_absent_or_only_under_a_device_condition_are_problems() -> None:
    ok = {"file": "m.py", "line": 1, "device_guards": []}
    guarded = {"file": "m.py", "line": 9, "device_guards": ["current_platform.is_cpu()"]}
    found = {n: [ok] for names in names_read(SGLANG_RULES).values() for n in names}
    assert series_problems("sglang", found) == []
    found["sglang:num_running_reqs"] = []
    found["sglang:token_usage"] = [guarded]
    probs = series_problems("sglang", found)
    assert any(p.startswith("gauge running: none of ['sglang:num_running_reqs']") for p in probs), probs
    assert any(p.startswith("gauge kv_usage_frac:") and "only under device conditions" in p for p in probs), probs
    found["sglang:num_retracted_requests_total"] = []  # a fallback series is enough
    assert not any("preemptions_total" in p for p in series_problems("sglang", found))


def test_version_pinned_by_the_cells() -> None:
    cells = project_cases("vllm")[1]
    assert version_problems("vllm", cells, "0.32.0+cpu") == []
    assert version_problems("vllm", cells, "0.33.0") == ["the cells pin vllm 0.32.0, the venv has 0.33.0"]


FAKE_LOGGERS = """
from prometheus_client import Counter, Gauge
from platforms import current_platform


class Logger:
    def __init__(self, cfg):
        self.a = Gauge(name="fake:running", documentation="x")
        self.b = self._counter_cls(name="fake:prompt_tokens", documentation="x")
        self.c = Counter(name="fake:hits_total", documentation="x")
        if current_platform.is_cuda():
            self.d = Gauge(name="fake:cuda_only", documentation="x")
        if cfg.num_gpu_blocks:
            self.e = Gauge(name="fake:blocks", documentation="x")
        name = "fake:info"
        self.f = self._gauge_cls(name=name, documentation="x", labelnames=["k"])
        self.g = Gauge(name="fake:xpu", documentation="x") if cfg.device == "xpu" else None
"""


def test_the_source_scan_finds_definitions_and_their_device_conditions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "fakeengine" / "metrics"
    pkg.mkdir(parents=True)
    (tmp_path / "fakeengine" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "loggers.py").write_text(FAKE_LOGGERS)
    (tmp_path / "fakeengine" / "envs.py").write_text('import os\nX = os.getenv("FAKE_DEV_MODE")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    scan = _scan_module()
    names = [
        "fake:running",
        "fake:prompt_tokens_total",
        "fake:hits_total",
        "fake:cuda_only",
        "fake:blocks",
        "fake:info",
        "fake:xpu",
        "fake:absent",
    ]
    got = scan.find_series("fakeengine", "fake:", names)
    assert got["fake:absent"] == [] and "fake:prompt_tokens" not in got
    assert (
        got["fake:prompt_tokens_total"][0]["kind"] == "counter"
        and got["fake:hits_total"][0]["exposes"][0] == "fake:hits_total"
    )
    assert got["fake:info"][0]["file"] == "fakeengine/metrics/loggers.py" and got["fake:info"][0]["kind"] == "gauge"
    assert (
        got["fake:running"][0]["device_guards"] == [] and got["fake:blocks"][0]["device_guards"] == []
    )  # num_gpu_blocks is no device test
    assert got["fake:cuda_only"][0]["device_guards"] == ["current_platform.is_cuda()"]
    assert got["fake:xpu"][0]["device_guards"] == ["cfg.device == 'xpu'"]
    assert scan.env_reads("fakeengine", ["FAKE_DEV_MODE", "FAKE_OTHER"]) == {
        "FAKE_DEV_MODE": ["fakeengine/envs.py"],
        "FAKE_OTHER": [],
    }
    assert scan.exposed("x:h", "histogram")[:3] == ["x:h_bucket", "x:h_sum", "x:h_count"]
    sys.modules.pop("fakeengine", None)
