"""Every cell's launch command, parsed by the engine's own argument parser, compared with the cell.

Why: no run here has a GPU, so the launch commands of the GPU cells (A100, H200, native pool,
Llama, vLLM) are never executed before a user's first GPU job; a renamed flag, a value of the wrong
type or a flag the engine reads differently would end that job in the engine's argument parser,
hours into a queue. This check builds each cell's command through the adapters (exactly what a run
launches), hands the engine's part of it to a small driver running inside the engine's own venv
(engine_drivers/launch_vllm.py: vLLM's server parser and serve-args validation; launch_sglang.py:
SGLang's `ServerArgs` CLI parsing), and compares what the engine parsed with what the cell says:
pool size, page size, schedule policy, chunked prefill, max running, the cache flags, attention
backend, context length, model and revision. In the same call the driver looks in that version's
source for every /metrics series the gauges and the smoke test read (metrics.names_read), on every
code path, and for the environment variables the launch sets (engine_drivers/source_scan.py).

Nothing here starts a server: one driver process per engine parses every cell (seconds, most of
it the engine's import).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import CONFIG_ROOT, CellConfig, load_config
from harness.servers import get_adapter
from harness.servers.metrics import VLLM_CACHE_INFO_LABELS, names_read
from harness.servers.sglang import SGLANG_MODULE
from harness.servers.vllm import ENGINE_CACHE_ENV, VLLM_MODULE

DRIVERS = Path(__file__).resolve().parent / "engine_drivers"
DRIVER_FILES = {"vllm": "launch_vllm.py", "sglang": "launch_sglang.py"}
PYTHON_VARS = {"vllm": "AGENTLOAD_VLLM_PYTHON", "sglang": "AGENTLOAD_SGLANG_PYTHON"}
MODULES = {"vllm": VLLM_MODULE, "sglang": SGLANG_MODULE}
ENV_PREFIX = {"vllm": "VLLM_", "sglang": "SGLANG_"}
DRIVER_TIMEOUT_S = 600.0  # the engine's import dominates: 10-40 s on a loaded 2-core host


class LaunchCheckError(RuntimeError):
    """The check could not be made: no engine interpreter, or the driver crashed."""


@dataclass(frozen=True)
class LaunchCase:
    """One cell's launch: the engine's arguments and what the engine must parse from them."""

    key: str  # the cell's name (or a test's label)
    cell: str  # the cell file
    argv: tuple[str, ...]  # after `python -m <module>`
    env: dict[str, str]
    expected: dict[str, Any]


@dataclass
class LaunchReport:
    """The driver's answer, judged. `problems` is empty when every launch and series passed."""

    engine: str
    version: str
    cases: list[dict[str, Any]] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    env: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def cell_files(root: Path = CONFIG_ROOT / "cells") -> list[Path]:
    """Every cell config of the project, sorted by name."""
    return sorted(root.glob("*.yaml"))


def engine_args(argv: Sequence[str], module: str) -> list[str]:
    """The engine's own arguments: what follows `-m <module>` (past any wrapper, e.g. the CPU quota's)."""
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == module:
            return list(argv[i + 2 :])
    raise LaunchCheckError(f"the launch command does not run `-m {module}`: {list(argv)}")


def expected_values(cell: CellConfig, model: str) -> dict[str, Any]:
    """What the engine must parse from the cell's launch, in the engine's own field names
    (vLLM: EngineArgs / the frontend's namespace; SGLang: ServerArgs). None: the engine's default."""
    revision = cell.model_revision if model == cell.model else None
    if cell.engine.name == "vllm":
        return {
            "model": model, "revision": revision, "served_model_name": cell.model,
            "max_model_len": cell.context_length, "block_size": cell.page_size,
            "num_gpu_blocks_override": cell.kv_pool_tokens // cell.page_size, "max_num_seqs": cell.max_running,
            "max_num_batched_tokens": cell.chunked_prefill, "scheduling_policy": cell.schedule_policy,
            "enable_prefix_caching": cell.prefix_cache, "enable_prompt_tokens_details": True,
            "enable_per_request_metrics": True, "attention_backend": cell.attention_backend,
        }  # fmt: skip
    return {
        "model_path": model,
        "revision": revision,
        "served_model_name": cell.model,
        "max_total_tokens": cell.kv_pool_tokens,
        "context_length": cell.context_length,
        "page_size": cell.page_size,
        "schedule_policy": cell.schedule_policy,
        "chunked_prefill_size": cell.chunked_prefill,
        "max_running_requests": cell.max_running,
        "disable_radix_cache": not cell.prefix_cache,
        "radix_eviction_policy": "lru",
        "enable_cache_report": True,
        "enable_metrics": True,
        "attention_backend": cell.attention_backend,
        "device": cell.device,
        "mem_fraction_static": cell.mem_fraction_static,
    }


def build_case(cell_path: Path | str, *, extra_args: Sequence[str] = (), key: str | None = None,
               expect_from: CellConfig | None = None) -> LaunchCase:  # fmt: skip
    """The launch the adapters build for a cell (its model, a fixed loopback port, the cell's own
    launch_extras), with `extra_args` after them. `expect_from` compares with another cell's values
    instead (a test that a mismatch is caught)."""
    cell = load_config(cell_path, CellConfig)
    engine = cell.engine.name
    adapter = get_adapter(engine, cell=cell, server_cmd=["python", "-m", MODULES[engine]])
    saved = os.environ.pop(ENGINE_CACHE_ENV, None)  # a private cache adds only generic variables
    try:
        argv, env = adapter.launch_command(cell, model=cell.model, host="127.0.0.1", port=30000,
                                           extra_args=tuple(extra_args))  # fmt: skip
    finally:
        if saved is not None:
            os.environ[ENGINE_CACHE_ENV] = saved
    return LaunchCase(key or cell.name, str(cell_path), tuple(engine_args(argv, MODULES[engine])), dict(env),
                      expected_values(expect_from or cell, cell.model))  # fmt: skip


def engine_python(engine: str, python: str | None = None) -> str:
    """The engine venv's interpreter: the explicit one, else $AGENTLOAD_<ENGINE>_PYTHON."""
    py = python or os.environ.get(PYTHON_VARS[engine])
    if not py:
        raise LaunchCheckError(f"{PYTHON_VARS[engine]} is unset: point it at the {engine} engine venv's python")
    if not Path(py).exists():
        raise LaunchCheckError(f"{PYTHON_VARS[engine]}={py}: no such interpreter")
    return py


def same(expected: Any, parsed: Any) -> bool:
    """Equal, allowing the engines' containers: vLLM parses --served-model-name into a list."""
    if isinstance(parsed, list) and not isinstance(expected, list) and len(parsed) == 1:
        parsed = parsed[0]
    if isinstance(expected, float) or isinstance(parsed, float):
        try:
            return expected is not None and parsed is not None and float(expected) == float(parsed)
        except (TypeError, ValueError):
            return False
    return bool(expected == parsed)


def mismatches(expected: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """Every field the engine parsed differently from the cell (or does not know)."""
    return [f"{k}: the cell says {v!r}, the engine parsed {values.get(k, '<absent>')!r}" for k, v in expected.items()
            if not same(v, values.get(k, "<absent>"))]  # fmt: skip


def series_problems(engine: str, found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each gauge rule needs one of its series defined in the engine's source, on a code path that
    no device or platform condition limits (else it may exist on a CPU host and not on a GPU one)."""
    rules = get_adapter(engine).metric_map
    out = []
    for common, names in names_read(rules).items():
        if not names:
            continue  # derived from other outputs
        defs = [d for n in names for d in found.get(n, [])]
        if not defs:
            out.append(f"gauge {common}: none of {list(names)} is defined in {engine}'s source")
        elif all(d["device_guards"] for d in defs):
            where = "; ".join(f"{d['file']}:{d['line']} under {d['device_guards']}" for d in defs)
            out.append(f"gauge {common}: {list(names)} defined only under device conditions ({where})")
    return out


def run_driver(engine: str, request: dict[str, Any], python: str | None = None) -> dict[str, Any]:
    """One driver process in the engine's venv: the request in, the reply out."""
    py = engine_python(engine, python)
    try:
        proc = subprocess.run(
            [py, str(DRIVERS / DRIVER_FILES[engine])],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=DRIVER_TIMEOUT_S,
            cwd=DRIVERS,
        )
    except subprocess.TimeoutExpired:
        raise LaunchCheckError(f"the {engine} launch driver did not answer within {DRIVER_TIMEOUT_S:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        reply = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        reply = None
    if not isinstance(reply, dict) or "error" in reply:
        why = reply.get("error") if isinstance(reply, dict) else f"exit {proc.returncode}, no reply"
        raise LaunchCheckError(
            f"the {engine} launch driver failed: "
            f"{why}\n{(reply or {}).get('trace', '') if isinstance(reply, dict) else ''}"
            f"{proc.stderr[-3000:]}"
        )
    return reply


def check_engine(engine: str, cases: Sequence[LaunchCase], *, python: str | None = None) -> LaunchReport:
    """Parse every case with the engine's own parser and judge it; look up the series and variables."""
    rules = get_adapter(engine).metric_map
    series = sorted({n for names in names_read(rules).values() for n in names})
    env = sorted({k for c in cases for k in c.env if k.startswith(ENV_PREFIX[engine])})
    request = {
        "launches": [{"key": c.key, "argv": list(c.argv), "fields": list(c.expected)} for c in cases],
        "series": series,
        "labels": list(VLLM_CACHE_INFO_LABELS) if engine == "vllm" else [],
        "env": env,
    }
    reply = run_driver(engine, request, python)
    rep = LaunchReport(engine, str(reply.get("version")), series=reply["series"], env=reply["env"])
    by_key = {c.key: c for c in cases}
    for res in reply["launches"]:
        case = by_key[res["key"]]
        bad = [] if not res["ok"] else mismatches(case.expected, res["values"])
        rep.cases.append(
            {
                "key": case.key,
                "cell": case.cell,
                "argv": list(case.argv),
                "ok": res["ok"] and not bad,
                "error": res["error"],
                "mismatches": bad,
                "values": res["values"],
            }
        )
        if not res["ok"]:
            rep.problems.append(f"{case.key}: refused by {engine}'s parser: {res['error']}")
        rep.problems += [f"{case.key}: {m}" for m in bad]
    rep.problems += series_problems(engine, reply["series"])
    for label in reply.get("labels", {}).get("missing", []):
        rep.problems.append(f"vllm:cache_config_info has no label {label!r} (CacheConfig.metrics_info)")
    rep.problems += [
        f"the launch sets {k} but {engine}'s source never names it" for k, files in reply["env"].items() if not files
    ]
    return rep


def version_problems(engine: str, cells: Sequence[CellConfig], installed: str) -> list[str]:
    """The cells pin their engine's version; the venv the check ran in must be that version."""
    have = installed.split("+")[0]
    pinned = sorted({c.engine.version for c in cells if c.engine.name == engine})
    return [f"the cells pin {engine} {v}, the venv has {installed}" for v in pinned if v != have]


def project_cases(engine: str, cells: Sequence[Path] | None = None) -> tuple[list[LaunchCase], list[CellConfig]]:
    """The launch of every project cell of `engine` (configs/cells), and those cells."""
    cases, configs = [], []
    for p in cells if cells is not None else cell_files():
        cell = load_config(p, CellConfig)
        if cell.engine.name == engine:
            cases.append(build_case(p))
            configs.append(cell)
    return cases, configs


def check_cells(engine: str, cells: Sequence[Path] | None = None, *, python: str | None = None) -> LaunchReport:
    """Every project cell of `engine`, parsed and judged, and the venv's version against the cells'."""
    cases, configs = project_cases(engine, cells)
    rep = check_engine(engine, cases, python=python)
    rep.problems += version_problems(engine, configs, rep.version)
    return rep
