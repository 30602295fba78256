"""Shared fixtures for the integration tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

# The shared test helpers (gitfixture, slurm_fixture, ...) live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurm.local import ClusterError, ClusterStatus, down, ensure_up, status


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[ClusterStatus]:
    """The local single-node SLURM cluster with accounting, up for the whole pytest session.

    Brought up once per session through slurm/local/cluster.sh (installing its Debian packages on
    first use; needs root). If the fixture started it, it stops it again at the end of the session
    (AGENTLOAD_SLURM_KEEP=1 leaves it running); a cluster that was already up is left as found.
    AGENTLOAD_SKIP_SLURM=1 skips every test that uses it.
    """
    if os.environ.get("AGENTLOAD_SKIP_SLURM") == "1":
        pytest.skip("AGENTLOAD_SKIP_SLURM=1: the local SLURM cluster is not started")
    was_up = status().up
    if not was_up and os.geteuid() != 0:
        pytest.skip(
            "the local SLURM cluster is down and starting it needs root "
            "(run `sudo slurm/local/cluster.sh up` first, or set AGENTLOAD_SKIP_SLURM=1)"
        )
    try:
        info = ensure_up()
    except ClusterError as exc:
        pytest.fail(f"could not bring the local SLURM cluster up:\n{exc}", pytrace=False)
    try:
        yield info
    finally:
        if not was_up and os.environ.get("AGENTLOAD_SLURM_KEEP") != "1":
            down()


@pytest.fixture(scope="session")
def submitit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh submitit folder per session: job IDs restart at 1 after a cluster purge, and a reused
    folder would then hand back an earlier job's result file for a new job with the same ID."""
    return tmp_path_factory.mktemp("submitit")
