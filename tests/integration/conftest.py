"""Shared fixtures for the integration tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The shared test helpers (gitfixture, slurm_fixture, ...) live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from live_engines import EnginePool

from slurm.local import ClusterError, ClusterStatus, down, ensure_up, status


@pytest.fixture(scope="session")
def engine_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    """The real engine servers (and emulators) shared by the whole session, one per engine.

    A real server starts in 25-170 s here, so each is started once, on first use, and stopped at
    the end of the session (live_engines.py says which tests may not share it).
    """
    pool = EnginePool(tmp_path_factory.mktemp("engines"))
    try:
        yield pool
    finally:
        pool.close()


# the parametrized fixture whose engine names the servers a test uses (live_engines.servers_for)
_SERVER_FIXTURE = "live"


_BOOTED: list[bool] = []


@pytest.fixture(autouse=True)
def boot_real_engines(request: pytest.FixtureRequest) -> None:
    """Start booting every real engine server the selected tests will use, in the background, when
    the first test not marked `quiet` starts.

    A real server takes 25-170 s to start here; booted one after another they add up, booted
    together while the first tests run they mostly overlap. The emulator starts in seconds and is
    started on demand. Nothing is booted when no selected test uses a real engine. The `quiet`
    tests (they measure an engine's speed, and three servers booting on 2 cores moved the host's
    measured scale from 6.5-7.1 to 9.2-9.6) run first (tests/conftest.py), before any boot.
    """
    from live_engines import is_real, servers_for

    if _BOOTED or request.node.get_closest_marker("quiet") is not None:
        return
    _BOOTED.append(True)
    wanted: list[tuple[str, int | None]] = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        engine = params.get(_SERVER_FIXTURE)
        if isinstance(engine, str) and is_real(engine):
            wanted += [s for s in servers_for(engine) if s not in wanted]
    if wanted:
        pool: EnginePool = request.getfixturevalue("engine_pool")
        for engine, page in wanted:
            pool.prestart(engine, page)


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
