"""The local single-node SLURM cluster (with accounting), from Python.

A thin wrapper around `cluster.sh` beside this file, which does all the work (see its header and
slurm/README.md):

    from slurm.local import ensure_up, down, status

    info = ensure_up()        # installs/starts what is missing; a no-op when the cluster is up
    info.up, info.cluster, info.partition, info.node_state
    down()                    # cancels jobs and stops every daemon cluster.sh started

`ensure_up` returns when a probe job has really run (or, when everything was already running, when
the controller answers and the node is usable). Progress lines go to `echo` (default: stderr), so a
pytest session fixture shows them with `-s` and keeps them in the failure report otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import SchedulerError

__all__ = [
    "DEFAULT_STATE_DIR",
    "SCRIPT",
    "ClusterError",
    "ClusterStatus",
    "DaemonStatus",
    "down",
    "ensure_up",
    "is_up",
    "status",
]

#: The bring-up script.
SCRIPT: Path = Path(__file__).resolve().with_name("cluster.sh")
#: Where cluster.sh keeps the cluster's state unless $AGENTLOAD_SLURM_STATE says otherwise.
DEFAULT_STATE_DIR: Path = Path("/var/lib/agentload-slurm")

Echo = Callable[[str], None]


class ClusterError(SchedulerError):
    """cluster.sh failed; the message ends with the tail of its output."""

    def __init__(self, message: str, *, returncode: int | None = None, output: str = ""):
        tail = "\n".join(output.rstrip().splitlines()[-30:])
        super().__init__(message + (f"\n{tail}" if tail else ""))
        self.returncode = returncode
        self.output = output


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon: `running` when its PID file names a live (non-zombie) process of that program;
    `external` when it runs but was not started by cluster.sh (only munged can be shared), so `down`
    leaves it alone."""

    name: str
    running: bool
    pid: int | None
    external: bool


@dataclass(frozen=True)
class ClusterStatus:
    """`status` is "up" (every daemon running), "partial" or "down"."""

    status: str
    state_dir: Path
    cluster: str
    account: str
    partition: str
    node_state: str
    daemons: tuple[DaemonStatus, ...]

    @property
    def up(self) -> bool:
        return self.status == "up"


def _env(state_dir: str | os.PathLike[str] | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    if state_dir is not None:
        env["AGENTLOAD_SLURM_STATE"] = str(state_dir)
    if extra:
        env.update(extra)
    return env


def _default_echo(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_streaming(args: list[str], env: dict[str, str], echo: Echo | None, timeout_s: float) -> tuple[int, str]:
    """Run cluster.sh, passing each output line to `echo` as it comes; returns (rc, all output)."""
    lines: list[str] = []
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            if echo is not None:
                echo(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(timeout=5)
        raise ClusterError(f"cluster.sh {' '.join(args)} ran past {timeout_s:.0f} s", output="\n".join(lines)) from None
    reader.join(timeout=5)
    return rc, "\n".join(lines)


def status(*, state_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> ClusterStatus:
    """Where the local cluster stands; starts nothing and needs no root."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), "status", "--json"],
        env=_env(state_dir, env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode not in (0, 3, 4):
        raise ClusterError("cluster.sh status failed", returncode=proc.returncode, output=proc.stdout + proc.stderr)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise ClusterError("cluster.sh status --json printed no JSON", output=proc.stdout + proc.stderr) from exc
    return ClusterStatus(
        status=doc["status"],
        state_dir=Path(doc["state_dir"]),
        cluster=doc["cluster"],
        account=doc["account"],
        partition=doc["partition"],
        node_state=doc["node_state"],
        daemons=tuple(DaemonStatus(d["name"], d["running"], d["pid"], d["external"]) for d in doc["daemons"]),
    )


def is_up(*, state_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when every daemon of the local cluster is running."""
    return status(state_dir=state_dir).up


def ensure_up(
    *,
    state_dir: str | os.PathLike[str] | None = None,
    echo: Echo | None = _default_echo,
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
) -> ClusterStatus:
    """Bring the local cluster up (idempotent) and return its status.

    Installs the Debian packages when missing (needs root and a reachable package mirror), starts
    the daemons that are not running and waits until a probe job has run. Raises `ClusterError`
    with the script's output when anything fails.
    """
    rc, out = _run_streaming(["up"], _env(state_dir, env), echo, timeout_s)
    if rc != 0:
        raise ClusterError(f"cluster.sh up failed (exit status {rc})", returncode=rc, output=out)
    st = status(state_dir=state_dir, env=env)
    if not st.up:
        raise ClusterError(f"cluster.sh up returned but the cluster is {st.status}", output=out)
    return st


def down(
    *,
    state_dir: str | os.PathLike[str] | None = None,
    echo: Echo | None = _default_echo,
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> None:
    """Cancel the cluster's jobs and stop every daemon cluster.sh started (a no-op when it is down)."""
    rc, out = _run_streaming(["down"], _env(state_dir, env), echo, timeout_s)
    if rc != 0:
        raise ClusterError(f"cluster.sh down failed (exit status {rc})", returncode=rc, output=out)
