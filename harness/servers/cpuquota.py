"""Run an engine under a fixed CPU quota: `python -m harness.servers.cpuquota --cores C --name N -- ARGV...`.

Why: on a CPU host the engine runs as fast as the CPU it is left, so a cell calibrated while
other work ran on the machine describes a different engine than the same cell on an idle one
(the CPU vLLM cell measured λ_ref 17x apart between a loaded and an idle 2-core host). A quota
the kernel enforces (the cgroup `cpu` controller: `cpu.max` on cgroup v2, `cpu.cfs_quota_us` on
v1) makes the engine's speed a property of the cell (`engine_cpu_quota`, in cores): as long as
the host has that much CPU to spare, the engine gets exactly that much, idle host or not.

The wrapper creates (or reuses) the cgroup `agentload/<name>` under the mounted `cpu` hierarchy,
moves itself into it and then execs ARGV, so the engine and every process it starts (vLLM's
EngineCore, SGLang's scheduler) are inside; the argv on record (meta.json engine_launch) shows
the quota. With `--after-healthy` the group starts unthrottled and the adapter sets the quota
once the server answers its health check (`apply`): a server start is not measured, and under a
half-core quota it took several minutes of a run's budget. It refuses, with what to do, when no writable cgroup
`cpu` controller exists (a container without it, a non-root user without a delegated subtree).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.errors import EngineError

PERIOD_US = 100_000  # the kernel's default CFS period: the quota is granted per 100 ms
ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup"))


class QuotaError(EngineError):
    """No cgroup cpu controller to enforce the quota with."""


def _controller_root() -> tuple[Path, int]:
    """(root of a writable cpu hierarchy, cgroup version)."""
    for root in ROOTS:
        if (root / "cpu.cfs_quota_us").exists() and os.access(root, os.W_OK):
            return root, 1
        if (
            (root / "cgroup.controllers").exists()
            and "cpu" in (root / "cgroup.controllers").read_text().split()
            and os.access(root, os.W_OK)
        ):
            return root, 2
    raise QuotaError(
        "engine_cpu_quota needs a writable cgroup cpu controller (cgroup v1 /sys/fs/cgroup/cpu or v2 "
        "/sys/fs/cgroup with 'cpu' in cgroup.controllers) and none was found: run as root, delegate a "
        "cgroup subtree to this user, or remove engine_cpu_quota from the cell (its speed then depends on the host "
        "load)"
    )


def quota_group(name: str, cores: float | None) -> Path:
    """Create or reuse the cgroup agentload/<name> with a quota of `cores` CPUs (None: no quota
    yet); returns its path."""
    if cores is not None and not cores > 0:
        raise QuotaError(f"engine_cpu_quota: expected a positive number of cores, got {cores!r}")
    root, version = _controller_root()
    group = root / "agentload" / name
    if version == 2:
        parent = root / "agentload"
        parent.mkdir(exist_ok=True)
        ctl = root / "cgroup.subtree_control"
        if "cpu" not in ctl.read_text().split():
            ctl.write_text("+cpu")
        pctl = parent / "cgroup.subtree_control"
        if "cpu" not in pctl.read_text().split():
            pctl.write_text("+cpu")
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{'max' if cores is None else round(cores * PERIOD_US)} {PERIOD_US}")
    else:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(-1 if cores is None else round(cores * PERIOD_US)))
    return group


def apply(name: str, cores: float) -> float:
    """Set the quota of the running group agentload/<name> (the server is up); returns it as read back."""
    return quota_of(quota_group(name, cores))


def quota_of(group: Path) -> float:
    """The quota the cgroup enforces, in cores (what a run records)."""
    if (group / "cpu.max").exists():
        quota, period = (group / "cpu.max").read_text().split()
        return float("inf") if quota == "max" else int(quota) / int(period)
    quota_us = int((group / "cpu.cfs_quota_us").read_text())
    return float("inf") if quota_us < 0 else quota_us / int((group / "cpu.cfs_period_us").read_text())


def remove(name: str) -> bool:
    """Remove the group agentload/<name> once its processes are gone; False if it is still in use
    (or there is no controller): a stopped server leaves no cgroup behind, a live one keeps its own."""
    try:
        root, _ = _controller_root()
        (root / "agentload" / name).rmdir()
        return True
    except (QuotaError, OSError):
        return False


def join(group: Path, pid: int = 0) -> None:
    """Move process `pid` (0: this one) into the cgroup; its later children follow."""
    procs = group / "cgroup.procs"
    procs.write_text(str(pid or os.getpid()))


def wrap(
    argv: list[str], cores: float, name: str, python: str | None = None, *, after_healthy: bool = False
) -> list[str]:
    """The argv that runs `argv` under the quota (the harness's interpreter runs the wrapper)."""
    return [
        python or sys.executable,
        "-m",
        "harness.servers.cpuquota",
        "--cores",
        f"{cores:g}",
        "--name",
        name,
        *(["--after-healthy"] if after_healthy else []),
        "--",
        *argv,
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.servers.cpuquota", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=float, required=True, help="CPUs the command may use (e.g. 0.5)")
    ap.add_argument("--name", required=True, help="cgroup name under agentload/ (one per concurrent server)")
    ap.add_argument(
        "--after-healthy",
        action="store_true",
        help="start unthrottled; the adapter sets the quota once the server is up",
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to exec")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")
    try:
        group = quota_group(args.name, None if args.after_healthy else args.cores)
        join(group)
    except (QuotaError, OSError) as exc:
        print(f"cpuquota: {exc}", file=sys.stderr)
        return 2
    when = f"{args.cores:g} CPU once healthy" if args.after_healthy else f"{quota_of(group):g} CPU"
    print(f"cpuquota: {group} enforces {when}; exec {cmd[0]}", file=sys.stderr, flush=True)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
