"""The tests' handle on the emulated API server (``testkit.kube.ApiServer``): run it on
a real port in a thread of its own, and talk to it as a REST client would."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import kmock
import yaml

from testkit import crd_schema, wait_for
from testkit.kube import (
    BACKUP_CRD_FILE,
    CERTIFICATE_CRD_SCHEMA,
    CRD_FILE,
    KINDS,
    PODMONITOR_CRD_SCHEMA,
    SPARK_CRD_SCHEMA,
    ApiServer,
    storage_class,
)

# How long ``wait_for_event`` waits by default. An Event is the last link of a chain: kopf
# sees a change, a round (reading real servers in the e2e tests) writes the status, and
# only then is the Event created. On a
# loaded machine (the suite on two workers, two cores) that chain took longer than
# ``wait_for``'s 20 s; an unloaded run needs a second or two.
EVENT_PATIENCE = 90.0


class Cluster:
    """A running ``ApiServer`` on a real port (in its own thread) and a REST client for it."""

    def __init__(self) -> None:
        self.api = ApiServer()
        self.url = ""
        self.http: httpx.Client | None = None

    @staticmethod
    def path(kind: str, namespace: str | None = None, name: str | None = None) -> str:
        group, version, plural = KINDS[kind]
        base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        if namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{plural}"
        return f"{base}/{name}" if name else base

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        r = self.http.get(self.path(kind, namespace, name))
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def list(self, kind: str, namespace: str | None = None, selector: str = "") -> list[dict]:
        params = {"labelSelector": selector} if selector else {}
        r = self.http.get(self.path(kind, namespace), params=params)
        if r.status_code == 404:
            return []
        r.raise_for_status()
        return r.json()["items"]

    def events(self, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
        """The Events about object ``name`` with ``reason``, in the order they were made.

        The operator may create an Event just after the change it reports (a reconcile
        tells what it applied once it is applied): a test that has seen the change
        still waits for its Event (``wait_for_event``)."""
        return [
            e
            for e in self.list("Event", namespace)
            if e["reason"] == reason and e["involvedObject"]["name"] == name
        ]

    def wait_for_event(
        self,
        namespace: str,
        name: str,
        reason: str,
        containing: str = "",
        *,
        timeout: float = EVENT_PATIENCE,
    ) -> list[dict[str, Any]]:
        """Wait until an Event about ``name`` with ``reason`` (and ``containing`` in its
        message) is posted; return those Events."""
        return wait_for(
            lambda: [e for e in self.events(namespace, name, reason) if containing in e["message"]],
            timeout=timeout,
            message=lambda: (
                f"an Event {reason} on {name} saying {containing!r}; there are: "
                f"{[(e['reason'], e['message']) for e in self.list('Event', namespace)]}"
            ),
        )

    def create(self, obj: dict[str, Any]) -> httpx.Response:
        namespace = obj["metadata"].get("namespace")
        return self.http.post(self.path(obj["kind"], namespace), json=obj)

    def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        status: bool = False,
        strategic: bool = False,
    ) -> httpx.Response:
        """A merge patch, or a strategic merge patch (built-in kinds: a pod's conditions
        merge by type, as the kubelet writes them)."""
        url = self.path(kind, namespace, name) + ("/status" if status else "")
        kind_of_patch = "strategic-merge-patch" if strategic else "merge-patch"
        headers = {"Content-Type": f"application/{kind_of_patch}+json"}
        return self.http.patch(url, json=body, headers=headers)

    def delete(self, kind: str, namespace: str | None, name: str) -> httpx.Response:
        return self.http.delete(self.path(kind, namespace, name))

    def evict(self, namespace: str, name: str, *, dry_run: bool = False) -> httpx.Response:
        """Ask the Eviction API to evict a pod, as ``kubectl drain`` does for each pod: 201
        once deleted, 429 while its PodDisruptionBudget allows no disruption."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if dry_run:
            body["deleteOptions"] = {"dryRun": ["All"]}
        return self.http.post(self.path("Pod", namespace, name) + "/eviction", json=body)

    def install_spark_operator_crd(self) -> None:
        """The Spark Operator's ScheduledSparkApplication CRD, with its published schema."""
        published = json.loads(SPARK_CRD_SCHEMA.read_text())
        self.create(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": "scheduledsparkapplications.sparkoperator.k8s.io"},
                "spec": {
                    "group": "sparkoperator.k8s.io",
                    "scope": "Namespaced",
                    "names": {
                        "kind": "ScheduledSparkApplication",
                        "plural": "scheduledsparkapplications",
                        "singular": "scheduledsparkapplication",
                    },
                    "versions": [
                        {
                            "name": "v1beta2",
                            "served": True,
                            "storage": True,
                            "subresources": {"status": {}},
                            "schema": {"openAPIV3Schema": published["openAPIV3Schema"]},
                        }
                    ],
                },
            }
        ).raise_for_status()

    def install_custom_crd(self, kind: str, schema: dict[str, Any] | None = None) -> None:
        """The CRD of ``kind`` (one of ``KINDS``); objects are validated only against
        ``schema`` (an openAPIV3Schema) when one is given."""
        group, version_name, plural = KINDS[kind]
        version: dict[str, Any] = {"name": version_name, "served": True, "storage": True}
        if schema is not None:
            version["schema"] = {"openAPIV3Schema": schema}
        self.create(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{group}"},
                "spec": {
                    "group": group,
                    "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [version],
                },
            }
        ).raise_for_status()

    def install_podmonitor_crd(self, schema: dict[str, Any] | None = None) -> None:
        """The Prometheus Operator's PodMonitor CRD, validating against its published
        schema (tests/operator/crds/podmonitors.json) unless another is given."""
        published = json.loads(PODMONITOR_CRD_SCHEMA.read_text())["openAPIV3Schema"]
        self.install_custom_crd("PodMonitor", published if schema is None else schema)

    def install_certificate_crd(self) -> None:
        """cert-manager's Certificate CRD, validating against its published schema
        (tests/operator/crds/certificates.json)."""
        published = json.loads(CERTIFICATE_CRD_SCHEMA.read_text())["openAPIV3Schema"]
        self.install_custom_crd("Certificate", published)

    def install_crd_file(self, path: Path) -> None:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                self.create(doc).raise_for_status()

    def serve_crd_without_rules(self, path: Path = CRD_FILE) -> None:
        """Replace the CRD with itself without CEL rules (``crd_schema.without_rules``):
        a cluster where the operator's own refusals are all there is."""
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc = crd_schema.without_rules(doc)
                name = doc["metadata"]["name"]
                body = {"spec": doc["spec"]}
                self.patch("CustomResourceDefinition", None, name, body).raise_for_status()


@contextmanager
def cluster(*, crd: bool = True) -> Iterator[Cluster]:
    """An API server with the DurableStream CRD installed (``crd=False``: not yet, for a
    test that installs it as a user would, e.g. with helm), for the length of the block.

    It has a default StorageClass, ``standard``, that allows volume expansion, as
    most managed clusters do; a test adds a class without expansion where it needs one.
    """
    c = Cluster()
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with c.api, kmock.Server(c.api) as server:
            c.url = str(server.url).rstrip("/")
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the emulated API server did not start")
    c.http = httpx.Client(base_url=c.url, timeout=10)
    try:
        if crd:
            c.install_crd_file(CRD_FILE)
            c.install_crd_file(BACKUP_CRD_FILE)
        c.create(storage_class("standard", expandable=True, default=True)).raise_for_status()
        yield c
    finally:
        c.http.close()
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
