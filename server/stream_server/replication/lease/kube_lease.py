"""The replica set's Lease: read it, create it, replace it by compare-and-swap.

Every write names the ``resourceVersion`` it read; kube-apiserver (etcd)
answers 409 when someone wrote in between, and the writer has lost the race
(``LeaseConflict``). That is the only consensus the replica set uses: the
holder, the term and the in-sync set change together in one such write, so
no crash can leave a new holder with an old term or a stale ISR.

Our own small client over ``httpx`` rather than ``kubernetes.leaderelection``:
the latter's ``LeaseLock`` writes only the spec, and the term and ISR must
change in the same CAS as the holder (docs/replication.md).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from stream_server.replication.lease import kube_auth

PREFIX = "streams.pyds.dev/"
TERM = PREFIX + "term"
PRIMARY_URL = PREFIX + "primary-url"
IN_SYNC = PREFIX + "in-sync"
POSITIONS = PREFIX + "positions"
# How the current term began: "switchover" (handed over by the primary) or "election"
# (taken after the Lease ran out or was given up). The operator's Events say which.
TERM_BEGAN = PREFIX + "term-began"
# Standbys out of the in-sync set that still hold every acknowledged write (Kafka's
# eligible leader replicas, KIP-966): removed while too few were in sync for anything
# to be acknowledged without them. They may be elected as in-sync members may.
ELIGIBLE = PREFIX + "eligible"
# The replica set's id (identity.py): its members' data directories hold the same one.
SET_ID = PREFIX + "set-id"
# Metadata the replicas never write but carry through every replace as they read it:
# the operator's owner reference to the DurableStream (the garbage collector deletes the
# Lease with it), labels, finalizers, and annotations outside PREFIX. A replace that
# changed the owner references would drop what the operator set, and the
# OwnerReferencesPermissionEnforcement admission plugin would ask ``delete`` on the
# Lease of it, which the servers' Role does not grant.
KEPT = ("ownerReferences", "labels", "finalizers")

# The kubelet's mount of the pod's token and CA (read through kube_auth, as they rotate).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT = 5.0  # seconds for one API call: well inside a renew deadline
WATCH_SECONDS = 300  # a watch's length; the API server ends it, and it is opened again


class _QuietPolling(logging.Filter):
    """Drop httpx's INFO line for each Lease round and each look at a pod (all
    alike); failures are logged by the role loop and the pod marker themselves."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.args)
        return not any(p in text for p in ("/leases/", "/pods/"))


_quiet = _QuietPolling()
if _quiet not in logging.getLogger("httpx").filters:
    logging.getLogger("httpx").addFilter(_quiet)


class LeaseConflict(Exception):
    """Someone else changed (or created) the Lease since we read it: re-read."""


class LeaseUnavailable(Exception):
    """The API server could not be asked or refused for another reason than a race."""


Position = tuple[int, int]  # (term, lsn)


@dataclass
class LeaseRecord:
    """What the Lease says, decoded; ``version`` is the resourceVersion it was read at."""

    holder: str = ""
    duration: int = 15
    renew_time: str = ""
    acquire_time: str = ""
    transitions: int = 0
    term: int = 0
    primary_url: str = ""
    in_sync: list[str] = field(default_factory=list)
    positions: dict[str, Position] = field(default_factory=dict)
    eligible: list[str] = field(default_factory=list)  # ELIGIBLE
    began: str = ""  # TERM_BEGAN
    set_id: str = ""  # SET_ID; empty in a Lease written before set ids
    version: str = ""
    # KEPT and the annotations outside PREFIX, as read: written back unchanged.
    kept: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LeaseRecord:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        notes = meta.get("annotations") or {}
        kept = {k: meta[k] for k in KEPT if meta.get(k)}
        if foreign := {k: v for k, v in notes.items() if not k.startswith(PREFIX)}:
            kept["annotations"] = foreign
        positions = {
            str(k): (int(v[0]), int(v[1]))
            for k, v in _json(notes.get(POSITIONS), {}).items()
            if isinstance(v, list) and len(v) == 2
        }
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration=int(spec.get("leaseDurationSeconds") or 0),
            renew_time=spec.get("renewTime") or "",
            acquire_time=spec.get("acquireTime") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
            term=int(notes.get(TERM) or 0),
            primary_url=notes.get(PRIMARY_URL) or "",
            in_sync=[str(n) for n in _json(notes.get(IN_SYNC), [])],
            positions=positions,
            eligible=[str(n) for n in _json(notes.get(ELIGIBLE), [])],
            began=notes.get(TERM_BEGAN) or "",
            set_id=notes.get(SET_ID) or "",
            version=str(meta.get("resourceVersion") or ""),
            kept=kept,
        )

    def to_object(self, namespace: str, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {
            **copy.deepcopy(self.kept),
            "name": name,
            "namespace": namespace,
            "annotations": {
                **(self.kept.get("annotations") or {}),
                TERM: str(self.term),
                PRIMARY_URL: self.primary_url,
                IN_SYNC: json.dumps(self.in_sync),
                POSITIONS: json.dumps({k: list(v) for k, v in sorted(self.positions.items())}),
            },
        }
        if self.began:
            meta["annotations"][TERM_BEGAN] = self.began
        if self.eligible:
            meta["annotations"][ELIGIBLE] = json.dumps(self.eligible)
        if self.set_id:
            meta["annotations"][SET_ID] = self.set_id
        if self.version:
            meta["resourceVersion"] = self.version
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration,
            "leaseTransitions": self.transitions,
        }
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }


def _json(raw: str | None, default: Any) -> Any:
    """An annotation's JSON, or ``default`` when it is missing or not ours to read:
    a hand-edited annotation must not stop the role loop."""
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except ValueError:
        return default
    return value if isinstance(value, type(default)) else default


def micro_time(when: datetime | None = None) -> str:
    """A MicroTime as kube-apiserver writes it."""
    return (when or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def api_client(api: str = "") -> tuple[str, httpx.AsyncClient]:
    """The API server's base URL and a client for it: ``api`` as given, or in a cluster
    the pod's service account, as client-go's InClusterConfig (the Lease's client and
    the pod marker's, ``pod_labels.py``, each have their own). The token and the CA are
    re-read when the kubelet rotates them, and once more on a 401 (``kube_auth``)."""
    headers = {"User-Agent": "durable-streams-server/replication"}
    if api:
        return api.rstrip("/"), httpx.AsyncClient(headers=headers, timeout=TIMEOUT)
    base = kube_auth.in_cluster_url()
    if not base:
        raise LeaseUnavailable("no --kube-api and not in a cluster")
    auth = kube_auth.ServiceAccountAuth(SERVICE_ACCOUNT)
    return base, httpx.AsyncClient(
        headers=headers, auth=auth, verify=auth.ssl_context, timeout=TIMEOUT
    )


class LeaseClient:
    """One Lease object, over the Kubernetes REST API."""

    def __init__(self, lease: str, api: str = "") -> None:
        self.namespace, _, self.name = lease.partition("/")
        base, self.http = api_client(api)
        self.collection = f"{base}/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    async def close(self) -> None:
        await self.http.aclose()

    async def get(self) -> LeaseRecord | None:
        r = await self._call("GET", f"{self.collection}/{self.name}")
        if r.status_code == 404:
            return None
        return self._decoded(r)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; LeaseConflict when it exists already (someone was first)."""
        record.version = ""
        body = record.to_object(self.namespace, self.name)
        return self._decoded(await self._call("POST", self.collection, body))

    async def replace(self, record: LeaseRecord) -> LeaseRecord:
        """Write ``record`` if the Lease is still at ``record.version``, else LeaseConflict."""
        assert record.version, "a replace must name the version it read"
        body = record.to_object(self.namespace, self.name)
        return self._decoded(await self._call("PUT", f"{self.collection}/{self.name}", body))

    async def watch(self) -> AsyncIterator[LeaseRecord]:
        """Each change of the Lease as the API server pushes it (a watch on this one
        name), until the server ends the watch; LeaseUnavailable when it cannot be
        opened or breaks. It tells the role loop *that* something changed without
        waiting for a round, which no clock of ours can make late."""
        params = {
            "watch": "true",
            "fieldSelector": f"metadata.name={self.name}",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        timeout = httpx.Timeout(TIMEOUT, read=WATCH_SECONDS + TIMEOUT)
        try:
            async with self.http.stream(
                "GET", self.collection, params=params, timeout=timeout
            ) as r:
                if r.status_code != 200:
                    raise LeaseUnavailable(f"watch {self.collection}: {r.status_code}")
                async for line in r.aiter_lines():
                    event = _json(line, {})
                    obj = event.get("object")
                    if (
                        isinstance(obj, dict)
                        and (obj.get("metadata") or {}).get("name") == self.name
                    ):
                        yield LeaseRecord.from_object(obj)
        except httpx.HTTPError as exc:
            raise LeaseUnavailable(f"watch {self.collection}: {exc!r}") from exc

    async def _call(
        self, method: str, url: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        try:
            return await self.http.request(method, url, json=body)
        except httpx.HTTPError as exc:
            raise LeaseUnavailable(f"{method} {url}: {exc!r}") from exc

    @staticmethod
    def _decoded(r: httpx.Response) -> LeaseRecord:
        if r.status_code == 409:
            raise LeaseConflict(r.text[:200])
        if r.status_code >= 300:
            raise LeaseUnavailable(
                f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:200]}"
            )
        return LeaseRecord.from_object(r.json())
