"""The emulated API server's pod proxy behaves as kube-apiserver's (testkit.pod_proxy).

``kubectl dstream status --live`` reads each pod's ``GET /replication`` through it; if
one of these fails, that test proves less than it claims.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from testkit.cluster import Cluster, cluster

NS = "default"


def pod(name: str, port: int | None = 4437) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "server", "image": "ds:1"}
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [container]},
    }


@pytest.fixture
def kube() -> Iterator[tuple[Cluster, list[tuple[str, str, int]]]]:
    """A cluster whose pod ``p-0`` listens (a real HTTP server that says what it was
    asked), ``p-1`` runs nothing; the network's lookups are recorded."""

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps({"path": self.path}).encode()
            self.send_response(207)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    asked: list[tuple[str, str, int]] = []

    def network(namespace: str, name: str, port: int) -> str | None:
        asked.append((namespace, name, port))
        return f"http://127.0.0.1:{server.server_address[1]}" if name == "p-0" else None

    try:
        with cluster() as c:
            c.api.pod_network = network
            for name in ("p-0", "p-1"):
                c.create(pod(name)).raise_for_status()
            yield c, asked
    finally:
        server.shutdown()
        server.server_close()


def test_the_proxy_forwards_to_the_pods_port_and_answers_what_the_pod_answered(kube):
    c, asked = kube
    r = c.http.get(f"/api/v1/namespaces/{NS}/pods/p-0:4437/proxy/replication?x=1")
    assert (r.status_code, r.json()) == (207, {"path": "/replication?x=1"})
    assert r.headers["content-type"].startswith("application/json")
    # No port in the URL: the first port of the pod's containers.
    c.http.get(f"/api/v1/namespaces/{NS}/pods/p-0/proxy/").raise_for_status()
    assert asked == [(NS, "p-0", 4437), (NS, "p-0", 4437)]
    proxied = [x for x in c.api.requests if x.resource == "pods/proxy"]
    assert [(x.verb, x.group, x.namespace) for x in proxied] == [("get", "", NS)] * 2


def test_the_official_client_reaches_a_pod_through_the_proxy(kube):
    c, _asked = kube
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=c.url)))
    raw = api.connect_get_namespaced_pod_proxy_with_path(
        "p-0:4437", NS, "replication", _preload_content=False
    )
    assert json.loads(raw.data) == {"path": "/replication"}


def test_a_missing_pod_is_404_and_one_nothing_listens_for_is_503(kube):
    c, _asked = kube
    missing = c.http.get(f"/api/v1/namespaces/{NS}/pods/p-9:4437/proxy/replication")
    assert (missing.status_code, missing.json()["reason"]) == (404, "NotFound")
    assert missing.json()["message"] == 'pods "p-9" not found'
    down = c.http.get(f"/api/v1/namespaces/{NS}/pods/p-1:4437/proxy/replication")
    assert (down.status_code, down.json()["reason"]) == (503, "ServiceUnavailable")
    assert down.json()["message"].startswith("error trying to reach service: ")
