"""The ``simulated`` marker's map (testkit/simulated_tier.py): a process test left to
``make test-long`` must name the simulation's faults or mutants that cover it."""

from __future__ import annotations

import pytest

from testkit import simulated_tier
from testkit.simulated_tier import uncovered


def test_faults_and_mutants_of_the_simulation_cover_a_test():
    assert uncovered(["crash-primary", "commit-one-short"]) == []
    assert uncovered(["pause-primary", "clock-drift", "wake-unchecked", "clock-margin"]) == []


def test_a_name_the_simulation_does_not_know_or_no_name_covers_nothing():
    assert uncovered(["crash-primary", "full-disk"]) == ["'full-disk'"]
    assert uncovered([]) == ["(nothing)"]


class _Item:
    """What the hook reads of a collected test: its id and its closest marker."""

    def __init__(self, *names: str) -> None:
        self.nodeid = "tests/replication/test_x.py::test_y"
        self._mark = pytest.mark.simulated(*names).mark

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self._mark if name == "simulated" else None


def test_collection_stops_at_a_marker_that_names_no_cover(pytestconfig):
    simulated_tier.pytest_collection_modifyitems(pytestconfig, [_Item("crash")])  # type: ignore[list-item]
    with pytest.raises(pytest.UsageError, match=r"test_y: .*'full-disk'.*faults: .*crash"):
        simulated_tier.pytest_collection_modifyitems(pytestconfig, [_Item("full-disk")])  # type: ignore[list-item]
