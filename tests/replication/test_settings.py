"""A replica set's settings that cannot work together are refused at start, by name."""

from __future__ import annotations

import pytest

from stream_server.config import Settings
from stream_server.replication.settings import quorum

LEASE = {"replication_lease": "ns/ds", "replica_url": "http://127.0.0.1:4501"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replication_lease": "ds"}, "NAMESPACE/NAME"),
        ({"replication_lease": "ns/ds"}, "replica-url"),
        ({**LEASE, "lease_renew_deadline": 15.0}, "less than lease-duration"),
        ({**LEASE, "lease_retry_period": 10.0}, "less than lease-renew-deadline"),
        ({"replication_set_size": 6}, "1 to 5"),
        ({"replication_set_size": 3, "min_in_sync": 4}, "min-in-sync"),
        ({"replication_durability": "maybe"}, "required"),
        ({"replication_wait": -1.0}, "replication-wait"),
    ],
)
def test_bad_combinations_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**values)


def test_the_default_quorum_is_a_majority() -> None:
    assert [quorum(Settings(replication_set_size=n)) for n in range(1, 6)] == [1, 2, 2, 3, 3]
    assert quorum(Settings(replication_set_size=3, min_in_sync=3)) == 3


def test_single_node_mode_needs_none_of_it() -> None:
    assert Settings().replication_lease == ""
