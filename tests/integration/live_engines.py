"""Real engine servers for the integration tests, started once per test session.

Why one server per engine (and page size) and session: a real server starts in 25-290 s on a
shared 2-core machine (SGLang's tokenizer process alone takes 19-119 s), while each test needs
seconds of it. Every test gets the pool's server (`EnginePool.get`); conftest.py boots all the
real servers the selected tests need in the background when the session starts, so their boots
overlap each other and the first cases; the pool starts a server again only when a test killed it
on purpose (the dead-server fault) and a later one asks for it, and each test module stops its
servers when it is done. No test launches a real server of its own: a server the harness launches
and stops is the pool's (whose stop checks that no process is left) and, for SIGTERM during a run
that launched its own, the emulator's (tests/pipeline/test_faults.py).

Engines: "vllm" (AGENTLOAD_VLLM_PYTHON), "sglang" (AGENTLOAD_SGLANG_PYTHON) and our emulator in
either dialect ("emulator:vllm", "emulator:sglang"), which runs the same tests so that it keeps
speaking the real engines' dialects. AGENTLOAD_SKIP_VLLM=1 / AGENTLOAD_SKIP_SGLANG=1 skip an
engine, as does an unset python variable (each skip says which and why). AGENTLOAD_TINY_MODEL
names the tiny local model when set; otherwise it is built with the engine's python.

Cells (scaled down for a CPU, where a 40k-token prefill takes ~8 s): a 32,768-token pool, an
8,192-token context, 16 running, chunked prefill 8,192. vLLM needs 32-token blocks on a CPU;
SGLang runs with 1-token pages (the paper's setting) and, for the fault cases, 32-token pages.
The SGLang cell carries its CPU launch settings as data (device cpu, mem_fraction_static 0.5).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.config import CellConfig, load_config
from harness.servers import EngineAdapter, ServerHandle, free_port, get_adapter
from harness.servers.portstart import start_on_free_port
from harness.servers.vllm import private_cache_env

REPO = Path(__file__).resolve().parents[2]
POOL = 32_768
CONTEXT = 8_192
D = 16
MEM_FRACTION = 0.5  # SGLang on a CPU: the derived fraction is negative on this VM (docs/sglang-cpu.md)

ENGINE_PYTHON = {"vllm": "AGENTLOAD_VLLM_PYTHON", "sglang": "AGENTLOAD_SGLANG_PYTHON"}
ENGINE_SKIP = {"vllm": "AGENTLOAD_SKIP_VLLM", "sglang": "AGENTLOAD_SKIP_SGLANG"}
ENGINE_SETUP = {
    "vllm": "scripts/ci-engine-tests.sh",
    "sglang": "scripts/setup-sglang-cpu.sh or scripts/ci-engine-tests.sh",
}
MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
# vLLM: 256 MiB of KV memory holds the 1,024 blocks; eager mode starts ~2x faster than compiling on
# a fresh machine and the test's requests are tiny. The cell carries them (launch_extras), as the
# project's CPU vLLM cells do.
VLLM_ARGS = ("--dtype", "bfloat16", "--kv-cache-memory-bytes", str(256 << 20))
# SGLang: an idle scheduler loops over its sockets without blocking unless told to sleep on them
# (measured with the flag: 1 % of a core); an idle test server would otherwise take CPU from the
# cases running on another.
SGLANG_ARGS = ("--sleep-on-idle",)
START_TIMEOUT = {"vllm": 600.0, "sglang": 900.0}
#: Page size of the server an engine's fault cases may kill, by dialect (absent: its main server):
#: SGLang's run on a second server of 32-token pages, vLLM's on its one server of 32-token blocks.
FAULT_PAGE = {"sglang": 32}


def servers_for(engine: str) -> list[tuple[str, int | None]]:
    """(engine, page size) of every server the engine's integration cases use."""
    page = FAULT_PAGE.get(flavor_of(engine))
    return [(engine, None)] + ([(engine, page)] if page is not None else [])


def flavor_of(engine: str) -> str:
    """The API dialect: 'vllm' or 'sglang' (the emulator's follows its suffix)."""
    return engine.partition(":")[2] or engine


def is_real(engine: str) -> bool:
    return engine in ENGINE_PYTHON


def cell_data(engine: str, *, page_size: int | None = None) -> dict[str, Any]:
    """The test cell for an engine (and the emulator that imitates it)."""
    sglang = flavor_of(engine) == "sglang"
    data: dict[str, Any] = {
        "kind": "cell",
        "name": f"tiny-{'sglang' if sglang else 'vllm'}-cpu" + (f"-p{page_size}" if page_size else ""),
        "description": "test cell: tiny random model on a CPU, scaled-down pool and context",
        "engine": {"name": "sglang", "version": "0.5.22"} if sglang else {"name": "vllm", "version": "0.32.0"},
        "model": "tiny",
        "gpu": "cpu",
        "kv_pool_tokens": POOL,
        "page_size": page_size or (1 if sglang else 32),
        "schedule_policy": "fcfs",
        "chunked_prefill": CONTEXT,
        "max_running": 16,
        "prefix_cache": True,
        "waiting_prefix_refresh": sglang,
        "batching": "separate" if sglang else "mixed",
        "context_length": CONTEXT,
    }
    if sglang:
        data |= {"attention_backend": "torch_native", "device": "cpu", "mem_fraction_static": MEM_FRACTION}
    else:
        eager = () if os.environ.get("AGENTLOAD_VLLM_COMPILE") == "1" else ("--enforce-eager",)
        data["launch_extras"] = [*VLLM_ARGS, *eager]
    return data


def write_cell(engine: str, path: Path, *, page_size: int | None = None) -> Path:
    path.write_text(yaml.safe_dump(cell_data(engine, page_size=page_size), sort_keys=False))
    return path


def engine_python_or_skip(engine: str) -> str:
    """The engine venv's python, or skip the test with the reason."""
    skip_var, py_var = ENGINE_SKIP[engine], ENGINE_PYTHON[engine]
    if os.environ.get(skip_var) == "1":
        pytest.skip(f"{skip_var}=1: the real-{engine} tests are skipped")
    python = os.environ.get(py_var)
    if not python:
        pytest.skip(
            f"{py_var} is unset: the real-{engine} tests need the engine venv ({ENGINE_SETUP[engine]} sets it up)"
        )
    if not Path(python).exists():
        pytest.fail(
            f"{py_var}={python} does not exist; rebuild the engine venv with {ENGINE_SETUP[engine]}", pytrace=False
        )
    return python


def tiny_model(python: str, folder: Path) -> str:
    env_model = os.environ.get("AGENTLOAD_TINY_MODEL")
    if env_model and (Path(env_model) / "config.json").exists():
        return env_model
    out = folder / "tiny-model"
    subprocess.run(
        [python, str(REPO / "harness/servers/tiny_model.py"), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return str(out)


def engine_cache(folder: Path) -> dict[str, str]:
    """Private compile caches and temp files (AGENTLOAD_ENGINE_CACHE when CI provides one)."""
    return private_cache_env(Path(os.environ.get("AGENTLOAD_ENGINE_CACHE") or folder / "engine-cache"))


@dataclass
class Live:
    """One running server and what the tests need to talk to it."""

    engine: str  # what `--engine` takes: vllm, sglang, emulator:vllm, emulator:sglang
    adapter: EngineAdapter
    cell: CellConfig
    cell_path: Path
    handle: ServerHandle
    model_name: str
    start_seconds: float
    model: str = "tiny"  # the weights the server loaded (a path for the real engines)
    python: str | None = None
    folder: Path = field(default_factory=Path)
    key: str = ""  # the pool's name for it: the engine, with @<page size> when not the default

    @property
    def url(self) -> str:
        return self.handle.base_url

    @property
    def block(self) -> int:
        return self.cell.page_size

    @property
    def flavor(self) -> str:
        return flavor_of(self.engine)

    @property
    def pgid(self) -> int:
        assert self.handle.pid is not None
        return self.handle.pid  # start_new_session: the leader's pid is the group id

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.handle.process is not None and self.handle.process.poll() is None


def port_holders(port: int) -> list[int]:
    """pids of processes whose command line names `--port <port>` (an engine and its workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == b"--port" and b == str(port).encode() for a, b in itertools.pairwise(args)):
            out.append(int(d.name))
    return out


@dataclass
class Launch:
    """Everything a server start needs, settled in the main thread (where a test may skip)."""

    key: str
    engine: str
    folder: Path
    cell_path: Path
    cell: CellConfig
    adapter: EngineAdapter
    model: str
    python: str | None
    extra: list[str]
    env: dict[str, str]
    timeout: float


def plan_launch(engine: str, folder: Path, key: str, page_size: int | None = None) -> Launch:
    folder.mkdir(parents=True, exist_ok=True)
    cell_path = write_cell(engine, folder / "cell.yaml", page_size=page_size)
    cell = load_config(cell_path, CellConfig)
    if not is_real(engine):
        adapter = get_adapter(engine, cell=cell, cell_ref=str(cell_path))
        return Launch(key, engine, folder, cell_path, cell, adapter, "tiny", None, [], {}, 60.0)
    python = engine_python_or_skip(engine)
    model = tiny_model(python, folder)
    extra = [*SGLANG_ARGS] if engine == "sglang" else []  # vLLM's are the cell's (cell_data)
    adapter = get_adapter(engine, cell=cell, server_cmd=[python, "-m", MODULES[engine]])
    return Launch(
        key, engine, folder, cell_path, cell, adapter, model, python, extra, engine_cache(folder), START_TIMEOUT[engine]
    )


def launch(plan: Launch) -> Live:
    """Start the plan's server on a free port, on another if that one was taken meanwhile (the
    servers boot side by side: harness/servers/portstart.py, which says how many starts)."""
    t0 = time.monotonic()
    handle, _argv = start_on_free_port(
        plan.adapter,
        plan.cell,
        plan.folder / "server",
        model=plan.model,
        host="127.0.0.1",
        health_timeout=plan.timeout,
        extra_args=plan.extra,
        env=plan.env,
        pick_port=lambda: free_port(),  # looked up at each call: the pool's tests replace it
    )
    started = time.monotonic() - t0
    print(f"\n[{plan.key}] healthy after {started:.1f} s at {handle.base_url}")
    return Live(
        plan.engine,
        plan.adapter,
        plan.cell,
        plan.cell_path,
        handle,
        plan.adapter.served_model_name(plan.cell),
        started,
        plan.model,
        plan.python,
        plan.folder,
        plan.key,
    )


class EnginePool:
    """Servers shared by the whole test session, one per (engine, page size), started on first use.

    `prestart` boots one in a background thread (conftest.py boots every real server the selected
    tests need at once, at the start of the session: on 2 cores the boots overlap each other and
    the first tests instead of adding up); `get` waits for it. A server a test killed on purpose
    is started again only if a later test asks for it. Stopping checks that no process of the
    server is left, which is the harness's promise for every server it launches.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: dict[str, Live] = {}
        self.failed: dict[str, str] = {}
        self.pending: dict[str, Future[Live]] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engine-start")
        self._n = 0
        # The session fixture closes the pool; a session that ends without running its finalizers
        # (pytest's INTERNALERROR) would leave real servers holding CPU and ports for whatever runs
        # next on the machine (one such vLLM server was found after a CI-like run): stop them at exit.
        atexit.register(self._stop_left_at_exit)

    @staticmethod
    def key(engine: str, page_size: int | None = None) -> str:
        return engine if page_size is None else f"{engine}@{page_size}"

    def _plan(self, engine: str, page_size: int | None) -> Launch:
        key = self.key(engine, page_size)
        self._n += 1
        return plan_launch(engine, self.root / f"{key.replace(':', '-').replace('@', '-p')}-{self._n}", key, page_size)

    def prestart(self, engine: str, page_size: int | None = None) -> None:
        """Boot in the background; an engine that would skip (or fail) is left to `get` to say so."""
        key = self.key(engine, page_size)
        if key in self.servers or key in self.pending or key in self.failed:
            return
        try:
            plan = self._plan(engine, page_size)
        except (pytest.skip.Exception, pytest.fail.Exception):
            return
        self.pending[key] = self._pool.submit(launch, plan)

    def get(self, engine: str, page_size: int | None = None) -> Live:
        key = self.key(engine, page_size)
        if key in self.failed:
            pytest.fail(f"[{key}] the server did not start earlier in this session:\n{self.failed[key]}", pytrace=False)
        try:
            fut = self.pending.pop(key, None)
            if fut is not None:
                self.servers[key] = fut.result()
            live = self.servers.get(key)
            if live is not None and live.alive():
                return live
            if live is not None:  # killed by a fault test: a fresh one for whoever needs it next
                self.stop(key)
            self.servers[key] = launch(self._plan(engine, page_size))
        except Exception as exc:  # a start that failed once is not retried by every later test
            self.failed[key] = f"{type(exc).__name__}: {exc}"
            raise
        return self.servers[key]

    def stop(self, key: str) -> None:
        live = self.servers.pop(key, None)
        if live is None:
            return
        t0 = time.monotonic()
        live.adapter.stop(live.handle)
        left = port_holders(live.port)
        print(f"\n[{key}] stopped in {time.monotonic() - t0:.1f} s")
        if left:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"[{key}] processes {left} of the server outlived its stop")

    def _stop_left_at_exit(self) -> None:
        """Stop what `close` did not (nothing, after a normal session), saying so; never raises."""
        for fut in self.pending.values():
            fut.cancel()
        with contextlib.suppress(Exception):
            self._pool.shutdown(wait=True, cancel_futures=True)
        for key, fut in list(self.pending.items()):
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.servers.setdefault(key, fut.result())
        self.pending.clear()
        for key in list(self.servers):
            print(f"\n[{key}] still running at exit (the session did not close its pool): stopping it")
            with contextlib.suppress(Exception):
                self.stop(key)

    def close(self) -> None:
        atexit.unregister(self._stop_left_at_exit)
        errors = []
        for key, fut in list(self.pending.items()):
            with contextlib.suppress(Exception):
                self.servers[key] = fut.result()
        self.pending.clear()
        for key in list(self.servers):
            try:
                self.stop(key)
            except AssertionError as exc:
                errors.append(str(exc))
        self._pool.shutdown(wait=True)
        if errors:
            raise AssertionError("; ".join(errors))
