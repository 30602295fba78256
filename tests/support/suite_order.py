"""The suite's order and reruns, applied by tests/conftest.py's collection hook (and tested on their
own by tests/unit/test_suite_order.py: a test module cannot import the root conftest by name, since
every conftest.py of a session is a module named `conftest`).

- A test marked `wallclock` gets one rerun after 5 s (pytest-rerunfailures' `flaky`): it times
  real seconds, and on a 2-core machine one scheduler stall can make a try late.
- Tests marked `quiet` run first: they measure an engine's speed (the host's scale, the speed pin)
  while nothing else runs; tests/integration/conftest.py boots the session's shared engine servers
  only once the first other test starts.
- Tests marked `last` run after every other test of their session: they collect a long job that an
  earlier test submitted (the SLURM TIMEOUT job), which has then run its course beside the other
  tests, where collected at its module's end the session would wait minutes for it alone. Their
  fixtures are session-scoped, so the move does not set their module up again. A test marked both
  stays with the quiet ones, which must never wait for the others.
"""

from __future__ import annotations

from typing import Any

import pytest

WALLCLOCK_RERUNS = {"reruns": 1, "reruns_delay": 5}


def is_quiet(item: Any) -> bool:
    return item.get_closest_marker("quiet") is not None


def is_last(item: Any) -> bool:
    return item.get_closest_marker("last") is not None


def add_wallclock_reruns(items: list[Any]) -> None:
    for item in items:
        if item.get_closest_marker("wallclock") is not None and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(**WALLCLOCK_RERUNS))


def ordered(items: list[Any]) -> list[Any]:
    """quiet tests, then the others, then the `last` ones; each group in its collected order."""
    return (
        [i for i in items if is_quiet(i)]
        + [i for i in items if not is_quiet(i) and not is_last(i)]
        + [i for i in items if is_last(i) and not is_quiet(i)]
    )
