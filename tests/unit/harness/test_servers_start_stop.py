"""Starting and stopping an engine process without an engine: the whole process group comes up and
goes down together, and the start() failures a real launch can hit (port taken, never healthy,
exited early) are raised with their reason and the log's tail. Split from test_servers_adapters.py
(flags, request/response shapes, flush, metrics), whose cell-free helpers these tests do not need."""

from __future__ import annotations

import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.servers import EngineStartError, ServerHandle, free_port, port_in_use
from harness.servers.sglang import SGLangAdapter
from harness.servers.vllm import VLLMAdapter

HEALTHY_SERVER = textwrap.dedent(
    """\
    import http.server, subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # a worker in the group
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _group_alive(pgid: int) -> bool:
    import os

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_and_stop_whole_group(tmp_path: Path) -> None:
    port = free_port()
    a = VLLMAdapter()
    h = a.start(
        [sys.executable, "-c", HEALTHY_SERVER, str(port)], {}, tmp_path, host="127.0.0.1", port=port, health_timeout=20
    )
    assert isinstance(h, ServerHandle) and h.base_url == f"http://127.0.0.1:{port}"
    assert h.log_path == tmp_path / "server.log" and "agentload start" in h.log_path.read_text()
    time.sleep(0.3)
    assert _group_alive(h.pid)  # type: ignore[arg-type]
    a.stop(h, grace=3)
    assert h.process is not None and h.process.poll() is not None
    deadline = time.monotonic() + 5
    while _group_alive(h.pid) and time.monotonic() < deadline:  # type: ignore[arg-type]
        time.sleep(0.1)
    assert not _group_alive(h.pid)  # type: ignore[arg-type]
    a.stop(h)  # idempotent


def test_start_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        with pytest.raises(EngineStartError) as info:
            SGLangAdapter().start(
                [sys.executable, "-c", "pass"], {}, tmp_path, host="127.0.0.1", port=port, health_timeout=5
            )
    assert info.value.reason == "port_in_use" and "already in use" in str(info.value)
    assert not (tmp_path / "server.log").exists()  # nothing was launched


def test_start_never_healthy_is_killed(tmp_path: Path) -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as info:
        VLLMAdapter().start(
            [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(120)"],
            {},
            tmp_path,
            host="127.0.0.1",
            port=port,
            health_timeout=1.5,
        )
    assert info.value.reason == "never_healthy"
    assert "loading weights" in info.value.log_tail and "did not answer 200" in str(info.value)
    assert time.monotonic() - t0 < 15
    assert "sleep(120)" not in _ps()  # the sleeper was stopped with its group


def test_start_exited_early_shows_log(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(EngineStartError) as info:
        VLLMAdapter().start(
            [sys.executable, "-c", "import sys; print('error: unrecognized arguments: --bogus'); sys.exit(2)"],
            {"AGENTLOAD_TEST": "1"},
            tmp_path,
            host="127.0.0.1",
            port=port,
            health_timeout=30,
        )
    assert info.value.reason == "exited" and "code 2" in str(info.value)
    assert "unrecognized arguments: --bogus" in str(info.value)


def _ps() -> str:
    import subprocess

    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout
