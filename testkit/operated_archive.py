"""The operator's archive features on real parts: DurableStreams whose pods are real
server processes (``testkit.kubelet.Kubelet``, one per DurableStream) with a real
S3 store (``testkit.seaweedfs``), for tests/operator/test_archive_e2e*.py.

The operator reaches each pod where its kubelet stand-in runs it (``Pods.pod_url``,
given to ``replica_set.use_pod_urls``), as cluster DNS would resolve the pod's name;
the store's credentials are a Secret the pods' env names (``secretKeyRef``), never
seen by the operator.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.s3_keys import REGION
from testkit.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS

NS = "default"
CREDENTIALS = "s3-credentials"
OCTET = {"content-type": "application/octet-stream"}


@dataclass
class Pods:
    """Every DurableStream's kubelet stand-in, by DurableStream name."""

    kubelets: dict[str, Kubelet] = field(default_factory=dict)

    def pod_url(self, name: str, namespace: str, pod: str, spec: object) -> str:
        kubelet = self.kubelets.get(name)
        if kubelet is None:
            return "http://0.0.0.0:9"
        return kubelet.pod_url(name, namespace, pod, spec)

    @contextmanager
    def run(
        self, c: Cluster, name: str, spec: dict[str, Any], root: Path, restart_delay: float = 0.5
    ) -> Iterator[Kubelet]:
        """Create the DurableStream ``name`` and play its pods (under ``root / name``)
        once the operator has made its StatefulSet."""
        c.create(durable_stream(name, spec)).raise_for_status()
        wait_for(lambda: c.get("StatefulSet", NS, name), message=f"{name}'s StatefulSet")
        with Kubelet(c, NS, name, root / name, restart_delay=restart_delay) as kubelet:
            self.kubelets[name] = kubelet
            yield kubelet


@contextmanager
def operated_with_pods() -> Iterator[tuple[Cluster, Pods]]:
    """An emulated API server with the operator running on it, its pods played by
    ``Pods`` (reached at their own URLs), and the bucket's credentials Secret."""
    from stream_operator.controllers import replica_set
    from testkit.cluster import cluster
    from testkit.operator import running_operator

    pods = Pods()
    with cluster() as c:
        replica_set.use_pod_urls(pods.pod_url)
        try:
            with running_operator(c):
                credentials_secret(c)
                yield c, pods
        finally:
            replica_set.use_pod_urls(None)


def backed_up_spec(seaweed: SeaweedFS, destination: str) -> dict[str, Any]:
    """A DurableStream's spec that archives to ``destination`` (0.5 s archive timeout)."""
    return {"backup": {"objectStore": object_store(seaweed, destination), "archiveTimeout": 0.5}}


def credentials_secret(c: Cluster, name: str = CREDENTIALS) -> None:
    """The store's keys as a user writes them (``stringData``)."""
    c.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NS},
            "stringData": {
                "ACCESS_KEY_ID": ACCESS_KEY,
                "ACCESS_SECRET_KEY": SECRET_KEY,
                "REGION": REGION,
            },
        }
    ).raise_for_status()


def object_store(seaweed: SeaweedFS, destination: str) -> dict[str, Any]:
    """An ``objectStore``/``source`` of the spec: ``destination`` on the SeaweedFS."""
    sel = {"name": CREDENTIALS}
    return {
        "destinationPath": destination,
        "endpointURL": seaweed.endpoint,
        "s3Credentials": {
            "accessKeyId": {**sel, "key": "ACCESS_KEY_ID"},
            "secretAccessKey": {**sel, "key": "ACCESS_SECRET_KEY"},
            "region": {**sel, "key": "REGION"},
        },
    }


def status_of(c: Cluster, name: str) -> dict[str, Any]:
    return (c.get(KIND, NS, name) or {}).get("status") or {}


def condition(c: Cluster, name: str, ctype: str) -> dict[str, Any]:
    conds = status_of(c, name).get("conditions") or []
    return next((x for x in conds if x["type"] == ctype), {})


def take_backup(c: Cluster, cluster_name: str, name: str) -> dict[str, Any]:
    """A DurableStreamBackup of ``cluster_name``, created and waited for: its status."""
    body = {
        "apiVersion": "streams.pyds.dev/v1alpha1",
        "kind": "DurableStreamBackup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"cluster": cluster_name},
    }
    c.create(body).raise_for_status()

    def finished() -> dict[str, Any] | None:
        st = (c.get("DurableStreamBackup", NS, name) or {}).get("status") or {}
        return st if st.get("phase") in ("completed", "failed") else None

    return wait_for(finished, timeout=120, message=f"backup {name} finished")


def peer_token(c: Cluster, name: str) -> str:
    """A replica set's peer token (its ``<name>-replication`` Secret), which the archive
    endpoints of its servers ask for."""
    secret = c.get("Secret", NS, f"{name}-replication")
    assert secret is not None
    return base64.b64decode(secret["data"]["token"]).decode()


def archive_status(url: str, token: str | None = None) -> dict[str, Any]:
    auth = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{url}/_archive/status", headers=auth, timeout=10)
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def archived_all(url: str, token: str | None = None) -> int:
    """Wait until the server at ``url`` has archived every frame it made durable: that lsn."""

    def holds_all() -> int | None:
        st = archive_status(url, token)
        return int(st["archived_lsn"]) if st["archived_lsn"] >= st["durable_lsn"] > 0 else None

    return wait_for(holds_all, timeout=60, message=f"{url}'s archive to hold every frame")


def create(url: str, path: str, body: bytes) -> None:
    r = httpx.put(f"{url}/v1/stream/{path}", content=body, headers=OCTET, timeout=10)
    assert r.status_code in (200, 201), (r.status_code, r.text)


def append(url: str, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{url}/v1/stream/{path}", content=body, headers=OCTET, timeout=10)


def ready_url(c: Cluster, kubelet: Kubelet, name: str) -> str:
    """The address of ``name``'s first pod once the DurableStream is Ready."""
    wait_for(
        lambda: status_of(c, name).get("phase") == "Ready",
        timeout=120,
        message=lambda: f"{name} Ready: {status_of(c, name)} {kubelet.waiting}",
    )
    url = kubelet.url_of(f"{name}-0")
    assert url is not None
    return url
