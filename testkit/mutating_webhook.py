"""A mutating admission webhook stand-in: a service-mesh sidecar injector.

Istio's and Linkerd's injectors (and policy engines such as Kyverno that mutate
workload templates) change an object on its way into storage: a proxy container
appended, a volume for it, a label and an annotation. Whoever wrote the object never
sent those, and reads them back on every round; a controller that calls that drift
and writes its own rendering again fights the injector forever.

``SidecarInjector`` does that to every Pod and to every StatefulSet's pod template
created or updated while ``testkit.kube.ApiServer.webhook`` is set (a test turns it
on). It is idempotent, as a webhook must be (kube-apiserver may call it again, the
``reinvocationPolicy``): an object that already has the sidecar is left alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

PROXY = "istio-proxy"
VOLUME = "istio-envoy"
LABEL = ("security.istio.io/tlsMode", "istio")
STATUS_ANNOTATION = "sidecar.istio.io/status"


def _proxy() -> dict[str, Any]:
    return {
        "name": PROXY,
        "image": "docker.io/istio/proxyv2:1.23.2",
        "args": ["proxy", "sidecar"],
        "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": [{"name": VOLUME, "mountPath": "/etc/istio/proxy"}],
    }


@dataclass
class SidecarInjector:
    """Inject the proxy into Pods and StatefulSet pod templates; ``seen`` counts calls."""

    kinds: frozenset[str] = frozenset({"Pod", "StatefulSet"})
    seen: list[tuple[str, str]] = field(default_factory=list)

    def mutate(self, kind: str, obj: dict[str, Any]) -> None:
        """Mutate ``obj`` in place, as the webhook's JSON patch response would."""
        if kind not in self.kinds:
            return
        self.seen.append((kind, (obj.get("metadata") or {}).get("name", "")))
        pod = obj if kind == "Pod" else obj.setdefault("spec", {}).setdefault("template", {})
        meta = pod.setdefault("metadata", {})
        meta.setdefault("labels", {}).setdefault(*LABEL)
        spec = pod.setdefault("spec", {})
        containers = spec.setdefault("containers", [])
        if any(c.get("name") == PROXY for c in containers):
            return
        containers.append(copy.deepcopy(_proxy()))
        volumes = spec.setdefault("volumes", [])
        volumes.append({"name": VOLUME, "emptyDir": {"medium": "Memory"}})
        annotations = meta.setdefault("annotations", {})
        annotations[STATUS_ANNOTATION] = f'{{"containers":["{PROXY}"],"volumes":["{VOLUME}"]}}'
