"""A real HTTP server on a real port that plays a replica set's primary for the operator.

It answers ``POST /pods/<pod>/replication/switchover`` as the server-operator
contract says a primary does (docs/replication.md): the Bearer token must be
the one in the replica set's Secret (401 otherwise); a pod that does not hold
the Lease answers 409 ``NOT_PRIMARY``; a target outside the Lease's in-sync set
409 ``NOT_IN_SYNC``; otherwise it moves the Lease to the target with the next
term (as the primary's compare-and-swap would) and answers 200. Answers can
be scripted ahead (``fail_next``), e.g. a 503 when the target did not catch up.

Why a stand-in and not the real servers: the kopf tests play the StatefulSet
controller and the kubelet with Pod objects only (no processes), so there is no
server to ask; the switchover itself is the server's to test. What is real
here: HTTP on a socket, the token read from the Secret the operator made, and
the Lease in the emulated API server.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from testkit.loopback_http import JsonHandler, serving

TERM = "streams.pyds.dev/term"
IN_SYNC = "streams.pyds.dev/in-sync"


@dataclass
class StandIn:
    """The stand-in's record and script; ``url(pod)`` is where the operator reaches ``pod``."""

    api: str  # the emulated API server's URL
    namespace: str
    name: str  # the DurableStream
    base: str = ""
    calls: list[tuple[str, str, int]] = field(default_factory=list)  # (pod, target, status)
    script: list[tuple[int, str]] = field(default_factory=list)  # answers given first
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, name: str, namespace: str, pod: str, spec: dict[str, Any]) -> str:
        return f"{self.base}/pods/{pod}"

    def fail_next(self, status: int, code: str) -> None:
        with self.lock:
            self.script.append((status, code))

    def _lease_path(self) -> str:
        return (
            f"{self.api}/apis/coordination.k8s.io/v1/namespaces/{self.namespace}"
            f"/leases/{self.name}-leader"
        )

    def token(self) -> str | None:
        r = httpx.get(
            f"{self.api}/api/v1/namespaces/{self.namespace}/secrets/{self.name}-replication"
        )
        if r.status_code != 200:
            return None
        raw = (r.json().get("data") or {}).get("token")
        return base64.b64decode(raw).decode() if raw else None

    def answer(self, pod: str, auth: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        token = self.token()
        if token is None or auth != f"Bearer {token}":
            return 401, {"error": {"code": "UNAUTHORIZED", "message": "bad peer token"}}
        lease = httpx.get(self._lease_path()).json()
        notes = lease["metadata"].get("annotations") or {}
        holder = lease["spec"].get("holderIdentity")
        target = str(body.get("to") or "")
        with self.lock:
            scripted = self.script.pop(0) if self.script else None
        if scripted is not None:
            return scripted[0], {"error": {"code": scripted[1], "message": "scripted"}}
        if pod != holder:
            return 409, {"error": {"code": "NOT_PRIMARY", "message": f"{holder} is primary"}}
        if target not in json.loads(notes.get(IN_SYNC) or "[]"):
            return 409, {"error": {"code": "NOT_IN_SYNC", "message": f"{target} lags"}}
        term = int(notes.get(TERM) or 0) + 1
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        patch = {
            "metadata": {"annotations": {TERM: str(term)}},
            "spec": {"holderIdentity": target, "renewTime": now},
        }
        headers = {"Content-Type": "application/merge-patch+json"}
        httpx.patch(self._lease_path(), json=patch, headers=headers).raise_for_status()
        return 200, {"primary": target, "term": term, "paused_ms": 4.0}


@contextmanager
def primary_stand_in(api: str, namespace: str, name: str) -> Iterator[StandIn]:
    stand_in = StandIn(api, namespace, name)

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            parts = self.path.strip("/").split("/")
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if len(parts) != 4 or parts[0] != "pods" or parts[2:] != ["replication", "switchover"]:
                status, answer = 404, {"error": {"code": "NOT_FOUND"}}
                pod = ""
            else:
                pod = parts[1]
                status, answer = stand_in.answer(pod, self.headers.get("Authorization", ""), body)
            with stand_in.lock:
                stand_in.calls.append((pod, str(body.get("to") or ""), status))
            self.send_json(status, answer, {"Retry-After": "1"} if status == 503 else None)

    with serving(Handler, "primary") as base:
        stand_in.base = base
        yield stand_in
