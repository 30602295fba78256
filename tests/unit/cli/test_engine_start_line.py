"""An engine that does not start ends every command with one line: what its server log says (its
last meaningful line) and where that log is, with no traceback, through worker processes too.

The engine is a fake server command that prints a start-up failure the way vLLM does (a traceback
whose last line names the cause) and exits at once; every command launches it through the real
adapter code (argv, process group, health wait, log in the run directory).
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest
import yaml

from cli.main import main
from harness.config import CellConfig, load_config
from harness.servers.base import EngineStartError, last_said

CAUSE = "ValueError: Available memory 0.5 GiB is less than desired CPU memory utilization 0.9"
FAKE = f"""
import sys
print("INFO 12-01 starting the engine with", sys.argv[1:4], flush=True)
print("Traceback (most recent call last):", flush=True)
print('  File "serve.py", line 9, in <module>', flush=True)
print({CAUSE!r}, flush=True)
print("[rank0]: Warning: destroy_process_group() was not called before the program exit", flush=True)
print("", flush=True)
sys.exit(3)
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    """A CPU vLLM cell without the kernel CPU quota (nothing to enforce on a server that never
    runs), a one-run test of it, and the fake server command."""
    script = tmp_path / "serve.py"
    script.write_text(FAKE)
    cell = load_config("cells/vllm-cpu-tiny-131k", CellConfig).model_dump(mode="json")
    cell.pop("engine_cpu_quota")
    cell_path = tmp_path / "cell.yaml"
    cell_path.write_text(yaml.safe_dump(cell, sort_keys=False))
    test = yaml.safe_load(Path("configs/tests/e2-vllm-cpu.yaml").read_text())
    test.pop("registration")
    test.update(cell=str(cell_path), arms=["burst", "noburst"], rates=[1.35], seeds=[0], rule="e2-cpu")
    test_path = tmp_path / "test.yaml"
    test_path.write_text(yaml.safe_dump(test, sort_keys=False))
    return {"cell": str(cell_path), "test": str(test_path), "server_cmd": f"{sys.executable} {script}"}


def _one_line_with_the_cause(err: str, log: Path) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err and "internal error" not in err
    last = lines[-1]
    assert CAUSE in last and f"server log: {log}" in last and "exited with code 3" in last
    return last


def _launched_with_the_cells_extras(run_dir: Path) -> bool:
    """The run's meta.json records a launch carrying the cell's launch extras, given no --engine-arg."""
    argv = json.loads((run_dir / "meta.json").read_text())["engine_launch"]["argv"]
    extras = load_config("cells/vllm-cpu-tiny-131k", CellConfig).launch_extras or []
    i = argv.index(extras[0])
    return bool(extras) and argv[i : i + len(extras)] == extras


def test_smoke_ends_with_one_line(fake: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "smoke"
    rc = main(
        ["smoke", "--cell", fake["cell"], "--engine", "vllm", "--server-cmd", fake["server_cmd"], "--run-dir", str(d)]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1
    _one_line_with_the_cause(err, d / "server.log")


def test_calibrate_ends_with_one_line(fake: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal"
    args = ["calibrate", "e0a", "--cell", fake["cell"], "--engine", "vllm", "--server-cmd", fake["server_cmd"]]
    rc = main(
        [*args, "--out", str(out), "--n", "4", "--seeds", "0,1", "--check-n", "0", "--warmup", "1", "--window", "1"]
    )
    err = capsys.readouterr().err
    assert rc == 2
    last = _one_line_with_the_cause(err, out / "e0a-n4-s0" / "server.log")
    assert last.startswith("agentload: error: closed run n=4 seed=0 ended FAILED: engine did not start (exited)")
    assert not (out / "e0a-n4-s1").exists()  # the stage stopped at the first run that could not start
    assert _launched_with_the_cells_extras(out / "e0a-n4-s0")


def test_run_ends_with_one_line(fake: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = ["run", "--config", fake["test"], "--arm", "burst", "--rate", "1.35", "--seed", "0", "--engine", "vllm"]
    rc = main([*args, "--server-cmd", fake["server_cmd"], "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    _one_line_with_the_cause(err, out / "server.log")
    assert _launched_with_the_cells_extras(out)


def test_test_run_through_worker_processes_ends_with_one_line(
    fake: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t"
    args = ["test", "run", fake["test"], "--engine", "vllm", "--server-cmd", fake["server_cmd"], "--jobs", "2"]
    rc = main([*args, "--plain", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    last = _one_line_with_the_cause(err, out / "burst-r1.35-s0" / "server.log")
    assert last.startswith("the engine did not start in 2 of 2 run(s); burst-r1.35-s0: engine did not start")


def test_the_last_meaningful_line_and_a_picklable_error(tmp_path: Path) -> None:
    tail = "\n".join(
        [
            "=== agentload start 2026-12-01T00:00:00: X=1 python -m vllm --bogus",
            "INFO loading",
            "\x1b[31mERROR 12-01 engine core failed\x1b[0m",
            "Traceback (most recent call last):",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "[rank0]: Warning: destroy_process_group() was not called",
            "",
        ]
    )
    assert last_said(tail) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    # vLLM 0.32 on a CPU without the cell's memory flag (its server log, abridged): the cause, from
    # its name on, not the wrappers printed after it
    vllm = "\n".join(
        [
            "(VllmWorker-0 pid=4663) ERROR 12-01 22:59:16 [multiproc_executor.py:953]     raise ValueError(",
            "(VllmWorker-0 pid=4663) ERROR 12-01 22:59:16 [multiproc_executor.py:953] ValueError: Available memory "
            "on node 0 (14.17/16.46 GiB) on startup is less than desired CPU memory utilization (0.92, 15.15 GiB).",
            "(EngineCore pid=4524) ERROR 12-01 22:59:22 [core.py:1510] EngineCore failed to start.",
            "(EngineCore pid=4524) ERROR 12-01 22:59:22 [core.py:1510] Exception: WorkerProc initialization failed "
            "due to an exception in a background process. See stack trace for root cause.",
            *(["    raise RuntimeError("] * 30),
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        ]
    )
    assert last_said(vllm) == (
        "ValueError: Available memory on node 0 (14.17/16.46 GiB) on startup is less than desired CPU memory "
        "utilization (0.92, 15.15 GiB)."
    )
    assert last_said("INFO loading\nINFO still loading\n\n") == "INFO still loading"  # no failure stated: the last line
    assert last_said("=== agentload start ...\n\n") == ""
    assert last_said("error: " + "x" * 400).endswith("...") and len(last_said("error: " + "x" * 400)) == 300
    exc = EngineStartError(
        "exited", "server exited with code 1 before it became healthy", tail, tmp_path / "server.log"
    )
    back = pickle.loads(pickle.dumps(exc))
    assert (back.reason, back.log_tail, back.log_path, str(back)) == (exc.reason, exc.log_tail, exc.log_path, str(exc))
    assert "\n" not in str(exc) and str(exc).endswith(f"(server log: {tmp_path / 'server.log'})")
