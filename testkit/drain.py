"""``kubectl drain`` for tests: evict a node's pods through the Eviction API, as it does.

On one machine each pod stands for a node of its own, so draining a node is evicting its
one pod. ``kubectl drain`` posts an Eviction for each pod, and while the pod's
PodDisruptionBudget allows no disruption (429 TooManyRequests) it retries until its
``--timeout``; once the eviction is accepted it waits for the pod to be deleted. It never
waits for a replacement itself: the budget makes the next node's eviction wait until
the replacement counts as healthy again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from testkit import wait_for
from testkit.cluster import Cluster


@dataclass(frozen=True)
class Drained:
    """One node drained: its pod, the 429s it took, when it began (monotonic) and how long
    it took, and the budget's last word."""

    pod: str
    refusals: int
    started: float
    seconds: float
    last_refusal: str


def drain_pod(kube: Cluster, namespace: str, pod: str, *, timeout: float) -> Drained:
    """Evict ``pod``, retrying while the budget refuses, until accepted and the pod object
    it evicted is gone; AssertionError after ``timeout`` s (``kubectl drain --timeout``),
    naming what the budget said."""
    start = time.monotonic()
    before = kube.get("Pod", namespace, pod)
    uid = ((before or {}).get("metadata") or {}).get("uid")
    refusals = 0
    said = ""

    def evicted() -> bool:
        nonlocal refusals, said
        r = kube.evict(namespace, pod)
        if r.status_code == 429:
            refusals += 1
            causes = (r.json().get("details") or {}).get("causes") or [{}]
            said = causes[0].get("message") or r.json().get("message", "")
            return False
        if r.status_code == 404:
            return True  # gone already
        assert r.status_code == 201, f"eviction of {pod}: {r.status_code} {r.text}"
        return True

    wait_for(
        evicted,
        timeout=timeout,
        message=lambda: f"the eviction of {pod} ({refusals} refusals, last: {said})",
    )

    def deleted() -> bool:
        now = kube.get("Pod", namespace, pod)
        return now is None or now["metadata"].get("uid") != uid

    wait_for(deleted, timeout=timeout, message=f"{pod} deleted after its eviction")
    return Drained(pod, refusals, start, time.monotonic() - start, said)
