"""The ``simulated`` marker: a test against real processes whose behaviour the simulated
replica set (testkit/simulate) covers on every ``make test``, so that it runs in
``make test-long`` only.

    @pytest.mark.simulated("crash-primary")

The marker's arguments are the map from the test to what covers it: faults of the
simulation's workload (``testkit.simulate.workload.FAULTS``) and mutants it must catch
(``testkit.simulate.mutants.MUTANTS``), which tests/simulation runs in ``make test``
(healthy seeds and every mutant). A marker with no name, or with a name that is neither,
stops the run at collection, so the map cannot go stale when the simulation changes.

The simulation models crashes, partitions and lost or slow messages, process pauses
(SIGSTOP then SIGCONT: ``pause``, ``pause-primary``) and clocks that drift within the
bound the Lease assumes (``clock-drift``, ``clock-drift-primary``). What it does not model
keeps its process tests in ``make test``: clocks past that bound (a deposed primary whose
clock runs slower learns of its successor from the Lease watch or from a standby's
``GET /replication``, neither simulated: tests/replication/test_faults_clock.py), a
machine's suspend (CLOCK_MONOTONIC stopping), ``preferred`` durability, worker processes,
the HTTP sender and recopy, full disks, switchover, TLS.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from testkit.simulate.mutants import MUTANTS
from testkit.simulate.workload import FAULTS


def uncovered(names: Iterable[object]) -> list[str]:
    """What a ``simulated`` marker names that the simulation neither throws nor catches
    (an empty marker names nothing that covers its test: ``["(nothing)"]``)."""
    given = list(names)
    if not given:
        return ["(nothing)"]
    return [repr(n) for n in given if n not in FAULTS and n not in MUTANTS]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        mark = item.get_closest_marker("simulated")
        if mark is None:
            continue
        wrong = uncovered(mark.args)
        if wrong:
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.simulated names {', '.join(wrong)}, which the "
                f"simulation neither throws (faults: {', '.join(FAULTS)}) nor catches "
                f"(mutants: {', '.join(MUTANTS)})"
            )
