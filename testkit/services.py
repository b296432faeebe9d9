"""Where a Service sends a client: the endpoints controller and kube-proxy, for tests.

In a cluster a writer reaches a DurableStream through its Service
(``<name>``, which for a replica set selects the pod labelled primary). The
endpoints controller keeps, for each Service, the ready pods its selector
matches, and kube-proxy sends each new connection to one of them. Here the
pods are the kubelet stand-in's processes on 127.0.0.1 (``testkit.kubelet``),
so ``ServiceEndpoints`` reads the Service and the pods from the emulated API
as the endpoints controller does, and asks the stand-in where each pod
listens (what a pod IP and the target port would give).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testkit.cluster import Cluster


def pod_ready(pod: dict[str, Any]) -> bool:
    """Ready as the endpoints controller counts it: the Ready condition true, not being
    deleted. Readiness gates count through that condition alone, as in Kubernetes: the
    kubelet (``testkit.kubelet``) writes Ready true only once every gate's is."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass
class ServiceEndpoints:
    """The ready pods behind one Service, as local URLs (``address``: pod name -> its
    origin, None when it runs nowhere; ``testkit.kubelet.Kubelet.url_of``).

    Like kube-proxy, which routes by the endpoints it last saw, ``urls`` answers from
    what it read at most ``refresh`` seconds ago: clients that share one instance ask
    the API server a few times a second, not once per request (the servers' Lease
    renewals go through the same API server)."""

    cluster: Cluster
    namespace: str
    name: str
    address: Callable[[str], str | None]
    refresh: float = 0.5
    _seen: tuple[float, list[str]] = (float("-inf"), [])
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pods(self) -> list[str]:
        """The names of the ready pods the Service selects now, in name order."""
        service = self.cluster.get("Service", self.namespace, self.name)
        selector = ((service or {}).get("spec") or {}).get("selector") or {}
        if not selector:
            return []  # no Service, or one without a selector: no endpoints to manage
        terms = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return sorted(
            p["metadata"]["name"]
            for p in self.cluster.list("Pod", self.namespace, terms)
            if pod_ready(p)
        )

    def urls(self) -> list[str]:
        """Where a connection to the Service may land now: each ready pod's origin."""
        with self._lock:
            at, pods = self._seen
            if time.monotonic() - at >= self.refresh:
                pods = self.pods()
                self._seen = (time.monotonic(), pods)
        return [url for pod in pods if (url := self.address(pod))]
