"""A leader stopped while its renewal is under way still releases the Lease.

The election thread renews on its own schedule; a SIGTERM can end the work while a
renewal has read the Lease and not yet written it. The release, reading after that
read, then lost its compare-and-swap (409) and left the Lease held, so the standby
waited it out (a CI run saw this: ``could not release the lease ... (409)``). The
release now waits for a renewal under way, and none starts after it.

The two threads' calls are held at the points where the interleaving matters, so the
outcome does not depend on the machine's speed: the renewal writes only once the
release has read (or after a second), and the release writes only once the renewal has
(or after a second).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest
from kubernetes import client

from stream_operator.kube import api_client, leadership
from testkit.cluster import cluster

NS = "default"
NAME = "durable-streams-operator"


def test_a_leader_stopped_during_a_renewal_releases_the_lease(monkeypatch: pytest.MonkeyPatch):
    api = client.CoordinationV1Api
    real_read, real_replace = api.read_namespaced_lease, api.replace_namespaced_lease
    renewal_in_flight, release_read, renewal_written = (threading.Event() for _ in range(3))
    released: list[str | None] = []

    def electing() -> bool:
        return threading.current_thread().name == "leader-election"

    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        lease = real_read(self, *args, **kwargs)
        if not electing():
            release_read.set()
        return lease

    def replace(self: Any, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        if electing() and arm.is_set():
            renewal_in_flight.set()
            release_read.wait(1.0)
            try:
                return real_replace(self, name, namespace, body, **kwargs)
            finally:
                renewal_written.set()
        if not electing():
            renewal_written.wait(1.0)
            released.append(body.spec.holder_identity)
        return real_replace(self, name, namespace, body, **kwargs)

    arm = threading.Event()  # the first renewals (the election itself) go through as is
    monkeypatch.setattr(api, "read_namespaced_lease", read)
    monkeypatch.setattr(api, "replace_namespaced_lease", replace)

    with cluster() as c:
        ac = api_client.new_api_client(client.Configuration(host=c.url), leader_only=False)
        timings = leadership.Timings(lease_duration=6, renew_deadline=4, retry_period=1)
        lead = leadership.Leadership(ac, NAME, NS, "op-a", timings)

        def work(stop: concurrent.futures.Future[None]) -> None:
            arm.set()
            assert renewal_in_flight.wait(30), "no renewal came"
            # SIGTERM now: the work returns while the renewal is under way.

        assert lead.run(work) is False, "the lease was lost"
        spec = (c.get("Lease", NS, NAME) or {}).get("spec") or {}
        assert released == [None], "the release did not write"
        assert spec.get("holderIdentity") is None, f"the lease is still held: {spec}"
