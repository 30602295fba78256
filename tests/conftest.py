"""Suite-wide settings.

Property tests run without hypothesis' per-example deadline: this suite runs on small shared
machines where one slow example (a scheduler hiccup, a loaded core) says nothing about the code,
and a deadline failure there would be a flaky test, not a finding. The number of examples is kept.

A test marked `wallclock` times real seconds (a wall-clock drive, a real engine, a CPU quota, a
SLURM job): on a 2-core machine a scheduler stall can make one try late, so such a test gets one
rerun after 5 s (pytest-rerunfailures' `flaky` marker; the summary says "rerun"). A real fault fails
both tries. Every other test gets no rerun: a failure there is a finding.

A test marked `quiet` runs before every other test (see pytest_collection_modifyitems).

When scripts/test-phases.sh installs the engines in the background while the tests run, a test
that needs an engine venv (marked `vllm`, `sglang` or `engine_venv`) waits for the install before it
starts, and fails with the install's log if the install failed (tests/support/pending_setup.py).
"""

import pytest
from hypothesis import settings
from support import pending_setup

settings.register_profile("agentload", deadline=None)
settings.load_profile("agentload")

WALLCLOCK_RERUNS = {"reruns": 1, "reruns_delay": 5}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("wallclock") is not None and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(**WALLCLOCK_RERUNS))
    # Tests marked `quiet` measure an engine's speed (the host's scale, the speed pin): they run
    # first, while nothing else runs; tests/integration/conftest.py boots the session's shared
    # engine servers only once the first other test starts. Their order among themselves is kept.
    items[:] = [i for i in items if is_quiet(i)] + [i for i in items if not is_quiet(i)]
    # While scripts/test-phases.sh still installs the engines in the background, the files with a
    # test that needs them go last (whole files, so that a module's fixtures, e.g. a SLURM job
    # submitted early to run beside the file's other tests, keep their overlap; the order is kept
    # otherwise): the other tests run meanwhile instead of waiting behind the first such test.
    if pending_setup.pending():
        waits = {i.path for i in items if needs_engine_venv(i)}
        items[:] = [i for i in items if i.path not in waits] + [i for i in items if i.path in waits]


def is_quiet(item: pytest.Item) -> bool:
    return item.get_closest_marker("quiet") is not None


NEEDS_ENGINE_VENV = ("vllm", "sglang", "engine_venv")


def needs_engine_venv(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in NEEDS_ENGINE_VENV)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: the engines' environment, waited for only by tests that need it."""
    if not pending_setup.pending():
        return
    try:
        pending_setup.load(wait=needs_engine_venv(item))
    except pending_setup.SetupFailed as exc:
        pytest.fail(str(exc), pytrace=False)
