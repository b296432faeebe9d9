"""Prometheus's Kubernetes pod discovery (``kubernetes_sd_configs: [{role: pod}]``), served
over HTTP service discovery from the emulated API server's Pod objects.

Debian's Prometheus is built without Kubernetes discovery, so a real Prometheus gets
the same targets through ``http_sd_configs`` instead: at each refresh this lists the
namespace's pods and answers what the pod role would produce (Prometheus
``discovery/kubernetes/pod.go``): one target per container port, ``__address__`` the
pod's address and port, and the ``__meta_kubernetes_*`` labels (namespace, pod name,
IP, ready, phase, uid, controller, every label and annotation with its ``present``
twin, container name, image, port name, number and protocol). Relabelling and scraping
are Prometheus's own.

The one stand-in: every pod listens on 127.0.0.1 on a port of its own (the kubelet
stand-in), so ``address(pod)`` gives where the pod with that name is reached now (None:
not running, which Prometheus treats as a pod without an IP: no target).
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from testkit import free_port
from testkit.cluster import Cluster

META = "__meta_kubernetes_"


def sanitize(name: str) -> str:
    """Prometheus's ``strutil.SanitizeLabelName``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pod: dict[str, Any], host_port: str) -> list[dict[str, Any]]:
    """The pod role's target groups for one pod reached at ``host_port`` (its IP and, in
    the stand-in, its own port in place of each container port)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    host = host_port.rsplit(":", 1)[0]
    ready = next(
        (c["status"].lower() for c in status.get("conditions") or [] if c["type"] == "Ready"),
        "unknown",
    )
    labels: dict[str, str] = {
        f"{META}namespace": meta["namespace"],
        f"{META}pod_name": meta["name"],
        f"{META}pod_ip": host,
        f"{META}pod_ready": ready,
        f"{META}pod_phase": status.get("phase", ""),
        f"{META}pod_node_name": (pod.get("spec") or {}).get("nodeName", ""),
        f"{META}pod_host_ip": status.get("hostIP", ""),
        f"{META}pod_uid": meta.get("uid", ""),
    }
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner:
        labels[f"{META}pod_controller_kind"] = owner["kind"]
        labels[f"{META}pod_controller_name"] = owner["name"]
    for prefix, values in (("label", meta.get("labels")), ("annotation", meta.get("annotations"))):
        for key, value in (values or {}).items():
            labels[f"{META}pod_{prefix}_{sanitize(key)}"] = value
            labels[f"{META}pod_{prefix}present_{sanitize(key)}"] = "true"
    groups = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            groups.append(
                {
                    "targets": [host_port],
                    "labels": {
                        **labels,
                        f"{META}pod_container_name": container["name"],
                        f"{META}pod_container_image": container.get("image", ""),
                        f"{META}pod_container_init": "false",
                        f"{META}pod_container_port_name": port.get("name", ""),
                        f"{META}pod_container_port_number": str(port["containerPort"]),
                        f"{META}pod_container_port_protocol": port.get("protocol", "TCP"),
                    },
                }
            )
    return groups


@contextmanager
def serving(
    cluster: Cluster, namespace: str, address: Callable[[str], str | None]
) -> Iterator[str]:
    """An HTTP service discovery endpoint for ``namespace``'s pods; yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            groups = []
            for pod in cluster.list("Pod", namespace):
                host_port = address(pod["metadata"]["name"])
                if host_port:
                    groups += pod_targets(pod, host_port)
            body = json.dumps(groups).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/targets"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
