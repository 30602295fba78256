"""Suite-wide settings.

Property tests run without hypothesis' per-example deadline: this suite runs on small shared
machines where one slow example (a scheduler hiccup, a loaded core) says nothing about the code,
and a deadline failure there would be a flaky test, not a finding. The number of examples is kept.

A test marked `wallclock` times real seconds (a wall-clock drive, a real engine, a CPU quota, a
SLURM job): on a 2-core machine a scheduler stall can make one try late, so such a test gets one
rerun after 5 s (pytest-rerunfailures' `flaky` marker; the summary says "rerun"). A real fault fails
both tries. Every other test gets no rerun: a failure there is a finding.

A test marked `quiet` runs before every other test, and one marked `last` after every other test
of its session (see pytest_collection_modifyitems).
"""

import pytest
from hypothesis import settings

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
    # Tests marked `last` collect a long job that an earlier test submitted (the SLURM TIMEOUT job):
    # at the end of the session the job has run its course beside every other test, where collected
    # at its module's end the session would wait minutes for it. Their fixtures are session-scoped,
    # so moving them does not set their module up again.
    items[:] = (
        [i for i in items if is_quiet(i)]
        + [i for i in items if not is_quiet(i) and not is_last(i)]
        + [i for i in items if is_last(i) and not is_quiet(i)]
    )


def is_quiet(item: pytest.Item) -> bool:
    return item.get_closest_marker("quiet") is not None


def is_last(item: pytest.Item) -> bool:
    return item.get_closest_marker("last") is not None
