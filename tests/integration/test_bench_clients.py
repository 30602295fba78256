"""Third-party benchmark clients measure what the engine model says: vLLM's `vllm bench serve` and
SGLang's `python -m sglang.bench_serving` (each in its engine's venv) against the emulator in that
engine's dialect, 200 streamed requests each, one at a time.

Before the emulator streamed token by token both clients completed every request but saw the whole
completion in one chunk (TTFT = end-to-end latency, TPOT 0). Now each token leaves when the model's
iteration that produced it ends, so with one request in flight (no queue) the model's first-token
time is one prefill iteration and its TPOT one decode iteration, both known from the cell's costs.

Tolerance: iterations cost >= 8 ms here; the clients' mean TPOT must be within 15% of the model's
decode step (measured with the machine's load average at 6: vLLM 8.17 ms, SGLang 8.28 ms against
8.02), the mean TTFT within 20% plus 15 ms of the model's first-token time (measured: 18.7 and
16.9 ms against 9.28 ms: the client's own HTTP, text and JSON path on a loaded 2-core machine) and
below half the end-to-end latency (what the clients saw before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from live_engines import engine_python_or_skip, tiny_model

from harness.config import CellConfig, load_config
from harness.servers import free_port
from harness.servers.vllm import VLLM_CLI

pytestmark = [pytest.mark.timeout(600), pytest.mark.wallclock]

REPO = Path(__file__).resolve().parents[2]
N, PROMPT, OUTPUT = 200, 64, 8
COST = {"a": 8e-3, "f0": 0.0, "b": 20e-6, "c_p": 0.0, "chunk": 8192, "c_d": 0.0, "speed": 1.0, "token_factor": 1.0}


def _cell(flavor: str, folder: Path) -> tuple[Path, CellConfig]:
    base = load_config("cells/sglang-a100-300k" if flavor == "sglang" else "cells/vllm-a100-300k", CellConfig)
    cell = base.model_copy(update={"name": "bench-clients", "kv_pool_tokens": 200_000, "context_length": 4096})
    cell = cell.model_copy(update={"cost": cell.cost.model_validate(COST)})
    path = folder / f"{flavor}-cell.yaml"
    path.write_text(yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"})))
    return path, cell


def _emulator(flavor: str, cell_path: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "harness.emulator", "serve", "--cell", str(cell_path), "--flavor", flavor]
    cmd += ["--time-scale", "1", "--port", str(port), "--served-model-name", "tiny", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"emulator exited: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("emulator never became healthy")


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, CellConfig]]:
    flavor = request.param
    cell_path, cell = _cell(flavor, tmp_path)
    port = free_port()
    proc = _emulator(flavor, cell_path, port, tmp_path / "emulator.log")
    try:
        yield port, cell
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)


def _model_times(cell: CellConfig) -> tuple[float, float]:
    """(first-token time, decode step) of one request alone: one prefill iteration, then decode
    iterations of one request (c_d = 0: all alike)."""
    cost = cell.cost.model()
    return cost.prefill_iteration(PROMPT, 0.0), cost.decode_time(1, 0.0)


def _check(done: int, ttft_ms: float, tpot_ms: float, cell: CellConfig) -> None:
    first, step = _model_times(cell)
    assert done == N
    assert tpot_ms > 0 and tpot_ms == pytest.approx(step * 1e3, rel=0.15)
    assert ttft_ms == pytest.approx(first * 1e3, rel=0.20, abs=15.0)
    assert ttft_ms < 0.5 * (first + (OUTPUT - 1) * step) * 1e3  # not the end-to-end latency


@pytest.mark.vllm
@pytest.mark.parametrize("served", ["vllm"], indirect=True)
def test_vllm_bench_serve_sees_the_models_ttft_and_tpot(served: tuple[int, CellConfig], tmp_path: Path) -> None:
    python = engine_python_or_skip("vllm")
    port, cell = served
    args = ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions"]
    args += ["--model", "tiny", "--tokenizer", tiny_model(python, tmp_path), "--dataset-name", "random"]
    args += ["--random-input-len", str(PROMPT), "--random-output-len", str(OUTPUT), "--random-range-ratio", "0"]
    args += ["--ignore-eos", "--num-prompts", str(N), "--max-concurrency", "1", "--request-rate", "inf"]
    args += ["--seed", "0", "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path)]
    args += ["--result-filename", "vllm.json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["VLLM_CACHE_ROOT"] = str(tmp_path / "vllm-cache")
    out = subprocess.run(
        [python, "-c", VLLM_CLI, "bench", "serve", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads((tmp_path / "vllm.json").read_text())
    _check(int(r["completed"]), float(r["mean_ttft_ms"]), float(r["mean_tpot_ms"]), cell)


@pytest.mark.sglang
@pytest.mark.parametrize("served", ["sglang"], indirect=True)
def test_sglang_bench_serving_sees_the_models_ttft_and_tpot(served: tuple[int, CellConfig], tmp_path: Path) -> None:
    python = engine_python_or_skip("sglang")
    port, cell = served
    result = tmp_path / "sglang.jsonl"
    args = ["--backend", "sglang-oai", "--base-url", f"http://127.0.0.1:{port}", "--model", "tiny"]
    args += ["--tokenizer", tiny_model(python, tmp_path), "--dataset-name", "random-ids"]
    args += ["--random-input-len", str(PROMPT), "--random-output-len", str(OUTPUT), "--random-range-ratio", "1"]
    args += ["--num-prompts", str(N), "--max-concurrency", "1", "--request-rate", "inf", "--seed", "0"]
    args += ["--disable-tqdm", "--warmup-requests", "1", "--output-file", str(result)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    out = subprocess.run(
        [python, "-m", "sglang.bench_serving", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads(result.read_text().strip().splitlines()[-1])
    _check(int(r["completed"]), float(r["mean_ttft_ms"]), float(r["mean_tpot_ms"]), cell)
