"""The suite's test order (tests/support/suite_order.py, applied by tests/conftest.py): `quiet` tests
first, then the rest in their order, then `last` tests (the SLURM TIMEOUT job's collection runs
after every other test of its session, so the job runs beside them instead of holding the session
up); and the `wallclock` reruns."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from support.suite_order import add_wallclock_reruns, ordered


@dataclass
class FakeItem:
    name: str
    marks: set[str] = field(default_factory=set)
    added: list[pytest.MarkDecorator] = field(default_factory=list)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.added.append(mark)


def _order(items: list[FakeItem]) -> list[str]:
    return [i.name for i in ordered(items)]


def test_quiet_first_last_at_the_end_and_the_rest_in_their_order() -> None:
    items = [
        FakeItem("a"),
        FakeItem("collect", {"last"}),
        FakeItem("b"),
        FakeItem("pin", {"quiet"}),
        FakeItem("c"),
        FakeItem("collect2", {"last"}),
    ]
    assert _order(items) == ["pin", "a", "b", "c", "collect", "collect2"]


def test_a_quiet_test_marked_last_still_runs_with_the_quiet_ones() -> None:
    # The quiet phase runs alone (scripts/test-phases.sh): its tests must never wait for the others.
    items = [FakeItem("a"), FakeItem("both", {"quiet", "last"}), FakeItem("b")]
    assert _order(items) == ["both", "a", "b"]


def test_wallclock_tests_get_their_one_rerun_and_no_other_test_does() -> None:
    items = [FakeItem("w", {"wallclock"}), FakeItem("plain")]
    add_wallclock_reruns(items)
    assert [m.mark.name for m in items[0].added] == ["flaky"] and items[1].added == []
