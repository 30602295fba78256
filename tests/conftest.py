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
from support.suite_order import add_wallclock_reruns, ordered

settings.register_profile("agentload", deadline=None)
settings.load_profile("agentload")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`wallclock` reruns, then the order: `quiet` first, `last` at the end (tests/support/suite_order.py)."""
    add_wallclock_reruns(items)
    items[:] = ordered(items)
