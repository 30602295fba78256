"""The engine CPU quota (harness/servers/cpuquota.py): the kernel, not the harness, caps the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.servers import cpuquota

pytestmark = pytest.mark.wallclock  # the quota is measured in CPU seconds of a busy loop timed in real seconds

BUSY = "import time\nt=time.monotonic()\nwhile time.monotonic()-t<1.5: pass\nprint(open('/proc/self/cgroup').read())"


def _available() -> bool:
    try:
        cpuquota._controller_root()
        return True
    except cpuquota.QuotaError:
        return False


@pytest.mark.skipif(
    not _available(), reason="no writable cgroup cpu controller on this host (the quota cannot be enforced here)"
)
def test_a_busy_command_under_a_quarter_core_is_throttled_by_the_kernel() -> None:
    name = f"test-{os.getpid()}"
    proc = subprocess.run(
        cpuquota.wrap([sys.executable, "-c", BUSY], 0.25, name), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert f"agentload/{name}" in proc.stdout, proc.stdout
    # the kernel's own account: a busy loop under a quarter core is throttled in most periods
    stat = dict(
        line.split()
        for line in (cpuquota.quota_group(name, 0.25) / "cpu.stat").read_text().splitlines()
        if line.strip()
    )
    assert int(stat.get("nr_throttled", 0)) > 0, (
        f"the busy loop was never throttled: the quota was not enforced ({stat})"
    )
    group = cpuquota.quota_group(name, 0.25)
    assert cpuquota.quota_of(group) == pytest.approx(0.25)
    group.rmdir()  # empty once the command exited


def test_refuses_a_nonpositive_quota_and_a_missing_command() -> None:
    with pytest.raises(cpuquota.QuotaError, match="positive"):
        cpuquota.quota_group("x", 0.0)
    with pytest.raises(SystemExit):
        cpuquota.main(["--cores", "1", "--name", "x"])


def test_a_cell_with_a_quota_launches_its_engine_under_the_wrapper() -> None:
    from harness.config import CellConfig, config_ref, load_config
    from harness.servers.vllm import VLLMAdapter

    cell = load_config(config_ref("vllm-cpu-tiny-131k", "cells"), CellConfig).model_copy(
        update={"engine_cpu_quota": 0.5}
    )
    argv, _ = VLLMAdapter().launch_command(cell, model="m", host="127.0.0.1", port=8123)
    assert (
        argv[1:8] == ["-m", "harness.servers.cpuquota", "--cores", "0.5", "--name", "vllm-8123", "--after-healthy"]
        and argv[8] == "--"
    )
    adapter = VLLMAdapter()
    adapter.launch_command(cell, model="m", host="127.0.0.1", port=8123)
    assert adapter.cpu_quota == ("vllm-8123", 0.5)  # set once the server is healthy (EngineAdapter.start)
    plain, _ = adapter.launch_command(
        cell.model_copy(update={"engine_cpu_quota": None}), model="m", host="127.0.0.1", port=8123
    )
    assert "harness.servers.cpuquota" not in plain and plain == argv[9:] and adapter.cpu_quota is None


@pytest.mark.skipif(
    not _available(), reason="no writable cgroup cpu controller on this host (the quota cannot be enforced here)"
)
def test_after_healthy_starts_unthrottled_and_apply_sets_the_quota() -> None:
    name = f"test-late-{os.getpid()}"
    proc = subprocess.run(
        cpuquota.wrap([sys.executable, "-c", "print(1)"], 0.5, name, after_healthy=True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "once healthy" in proc.stderr, proc.stderr
    group = cpuquota.quota_group(name, None)
    assert cpuquota.quota_of(group) == float("inf")
    assert cpuquota.apply(name, 0.5) == pytest.approx(0.5)
    assert cpuquota.remove(name) and not group.exists()


HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(open('/proc/self/cgroup').read().encode())
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.skipif(
    not _available(), reason="no writable cgroup cpu controller on this host (the quota cannot be enforced here)"
)
def test_a_started_server_gets_its_quota_once_healthy_and_loses_its_cgroup_at_stop(tmp_path) -> None:
    """EngineAdapter.start applies the cell's quota after the health check and records the cgroup
    on the handle; stop removes it."""
    import socket
    import urllib.request

    from harness.servers.vllm import VLLMAdapter

    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    adapter = VLLMAdapter()
    name = f"test-start-{port}"
    adapter.cpu_quota = (name, 0.5)
    argv = cpuquota.wrap([sys.executable, "-c", HEALTH_SERVER, str(port)], 0.5, name, after_healthy=True)
    handle = adapter.start(argv, {}, tmp_path, host="127.0.0.1", port=port, health_timeout=30)
    try:
        assert handle.cpu_group == name
        assert cpuquota.quota_of(cpuquota.quota_group(name, 0.5)) == pytest.approx(0.5)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read().decode()
        assert f"agentload/{name}" in body  # the server runs inside the group
    finally:
        adapter.stop(handle, grace=5.0)
    root, _ = cpuquota._controller_root()
    assert not (root / "agentload" / name).exists()
