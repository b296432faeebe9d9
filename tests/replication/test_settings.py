"""A replica set's settings that cannot work together are refused at start, by name."""

from __future__ import annotations

import pytest

from stream_server.config import Settings
from stream_server.replication.settings import quorum

LEASE = {"replication_lease": "ns/ds", "replica_url": "http://127.0.0.1:4501"}
SHORT = {"lease_duration": 3.0, "lease_renew_deadline": 2.0, "lease_retry_period": 0.3}


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
        ({"replication_read_staleness": 0.0}, "replication-read-staleness must be positive"),
        # Two heartbeats (a quarter of the renew deadline, at most 1 s) or less: refused.
        ({**LEASE, "replication_read_staleness": 2.0}, "twice the commit-point heartbeat"),
        ({**LEASE, **SHORT, "replication_read_staleness": 1.0}, r"heartbeat \(0.5s"),
        # The pod to label: a pod's name, this replica's name in the Lease, with a Lease.
        ({"replication_pod": "ds-0"}, "replication-pod needs replication-lease"),
        ({**LEASE, "replica_name": "ds-0", "replication_pod": "DS_0"}, "a pod's name"),
        ({**LEASE, "replica_name": "ds-0", "replication_pod": "ds-1"}, "must equal replica-name"),
    ],
)
def test_bad_combinations_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**values)


def test_a_read_staleness_just_over_two_heartbeats_is_taken() -> None:
    assert Settings(**LEASE).replication_read_staleness == 5.0
    Settings(**LEASE, replication_read_staleness=2.1)
    Settings(**LEASE, **SHORT, replication_read_staleness=1.1)


def test_the_default_quorum_is_a_majority() -> None:
    assert [quorum(Settings(replication_set_size=n)) for n in range(1, 6)] == [1, 2, 2, 3, 3]
    assert quorum(Settings(replication_set_size=3, min_in_sync=3)) == 3


def test_single_node_mode_needs_none_of_it() -> None:
    assert Settings().replication_lease == ""


def test_the_pod_to_label_is_this_replicas_own() -> None:
    assert Settings(**LEASE, replica_name="ds-0", replication_pod="ds-0").replication_pod == "ds-0"
    assert Settings(**LEASE).replication_pod == ""  # label nothing
