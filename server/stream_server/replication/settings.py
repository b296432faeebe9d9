"""The replica set's settings, checked together at start.

A Lease name without this replica's URL, or a renew deadline that is not
shorter than the lease, would start a server that can lose acknowledged
writes or never elect a primary: refuse it with the setting's name instead.
"""

from __future__ import annotations

import re
import socket

from stream_server.declared.groups import ReplicationSettings
from stream_server.replication.peers import peer_tls
from stream_server.replication.peers.peer_token import read_secret

__all__ = ["ReplicationSettings", "check_settings", "heartbeat", "quorum", "replica_name"]

HEARTBEAT_MAX = 1.0  # seconds (``heartbeat``)


def check_settings(s: ReplicationSettings) -> None:
    """ValueError naming the setting that is wrong; nothing is checked without a Lease
    beyond what would be wrong in any mode."""
    _check_any_mode(s)
    if s.replication_lease:
        _check_replica_set(s)


def _check_any_mode(s: ReplicationSettings) -> None:
    """What would be wrong with or without a Lease beyond each value's own range (its
    declaration's checks, run first): settings together, and the files named."""
    if not s.min_in_sync <= s.replication_set_size:
        raise ValueError("min-in-sync must be 0 (a majority) to replication-set-size")
    if s.replication_token_file:
        read_secret(s.replication_token_file)  # a missing or empty file fails here, at start
    peer_tls.check(s)  # so do the peers' CA bundle, client certificate and key
    if s.replication_pod and not s.replication_lease:
        raise ValueError("replication-pod needs replication-lease")


def _check_replica_set(s: ReplicationSettings) -> None:
    """What a replica set's member needs besides: a Lease name, its own URL, lease
    timings whose order the safety argument needs, and a read staleness bound its
    heartbeat can keep."""
    namespace, _, name = s.replication_lease.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError("replication-lease must be NAMESPACE/NAME")
    if not s.replica_url.startswith(("http://", "https://")):
        raise ValueError("replica-url (http://HOST:PORT) is required with replication-lease")
    if not s.lease_renew_deadline < s.lease_duration:
        # The safety argument needs it: a primary stops acknowledging before anyone
        # else may take the Lease.
        raise ValueError("lease-renew-deadline must be less than lease-duration")
    if not s.lease_retry_period < s.lease_renew_deadline:
        raise ValueError("lease-retry-period must be less than lease-renew-deadline")
    check_pod(s)
    beat = heartbeat(s)
    if not s.replication_read_staleness > 2 * beat:
        # A standby's freshness is renewed by the heartbeat after the one its stamp
        # answered (docs/replication.md, "Reads"): a bound of two heartbeats or less
        # would refuse reads between rounds on an idle, healthy set.
        raise ValueError(
            f"replication-read-staleness must be more than twice the commit-point heartbeat "
            f"({beat:g}s: a quarter of lease-renew-deadline, at most {HEARTBEAT_MAX:g}s)"
        )


POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_pod(s: ReplicationSettings) -> None:
    """The pod to label (``pod_labels.py``) is a pod's name, and this replica's name in
    the Lease: the primary labels the other pods by the names the Lease gives them."""
    if not s.replication_pod:
        return
    if len(s.replication_pod) > 253 or not POD_NAME.fullmatch(s.replication_pod):
        raise ValueError("replication-pod must be a pod's name (a DNS subdomain)")
    if s.replication_pod != replica_name(s):
        raise ValueError(
            f"replication-pod ({s.replication_pod}) must equal replica-name "
            f"({replica_name(s)}): the Lease names the pods the primary labels"
        )


def heartbeat(s: ReplicationSettings) -> float:
    """Seconds between the primary's commit-only messages on an idle stream: often enough that a standby is never silent for
    half the renew deadline, the in-sync set's limit."""
    return min(HEARTBEAT_MAX, s.lease_renew_deadline / 4)


def quorum(s: ReplicationSettings) -> int:
    """Replicas, the primary included, that must hold a batch before it is acknowledged."""
    return s.min_in_sync or s.replication_set_size // 2 + 1


def replica_name(s: ReplicationSettings) -> str:
    return s.replica_name or socket.gethostname()
