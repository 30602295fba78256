"""Run provenance: what code, on what machine, under which scheduler job produced a run.

A verdict is only as checkable as the record of what produced its runs, so every run's meta.json
carries this block: the git commit and whether the tree was dirty, the host, the scheduler job,
the accelerator, and the versions of the packages that shape the numbers.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

_PACKAGES = ("agentload", "numpy", "scipy", "pandas", "pyarrow", "aiohttp", "pydantic")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes: the identity of a plan, registration or prediction."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _git(*args: str, cwd: Path = REPO_ROOT) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(cwd: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit, branch and dirty flag of the checkout the harness runs from (None outside git)."""
    commit = _git("rev-parse", "HEAD", cwd=cwd)
    if commit is None:
        return {"commit": None, "dirty": None, "branch": None}
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
    return {
        "commit": commit,
        "dirty": bool(status),
        "branch": _git("rev-parse", "--abbrev-ref", "HEAD", cwd=cwd),
    }


def gpu_info() -> list[dict[str, str]]:
    """Accelerators as nvidia-smi reports them; empty where there is none (simulator runs)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append(dict(zip(("name", "memory", "driver", "uuid"), parts)))
    return gpus


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def slurm_info() -> dict[str, str | None]:
    keys = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION")
    return {k.lower(): os.environ.get(k) for k in keys}


def capture(include_gpu: bool = True) -> dict[str, Any]:
    """The provenance block for a run's meta.json."""
    return {
        "captured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": git_state(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "slurm": slurm_info(),
        "gpus": gpu_info() if include_gpu else [],
        "argv": list(sys.argv),
    }
