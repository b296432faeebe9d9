"""A real HTTP server on loopback that plays the servers' archive endpoints for the operator.

It answers under ``/pods/<pod>/`` (``url(pod)`` is where the operator is pointed for
each pod, through ``replica_set.use_pod_urls``), as the server-operator contract in
docs/backup.md says a server does:

- ``POST /_archive/backups``: 201 with a backup summary (``id``, ``term``,
  ``start_lsn``, ``end_lsn``, ``time``, ``started``, ``stopped``, ``bytes``, ``node``);
- ``GET /_archive/status``: ``status`` (settable by the test);
- ``GET /_archive/backups``: the backups made so far and their recoverable range.

A token, when given, must come as ``Authorization: Bearer`` (401 otherwise). Answers
can be scripted ahead (``fail_next``). Why a stand-in: the kopf tests play pods as API
objects only; the endpoints themselves are the server's to test (tests/archive/).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from testkit.loopback_http import JsonHandler, serving


@dataclass
class ArchiveStandIn:
    """The stand-in's record and script."""

    base: str = ""
    token: str | None = None  # None: any caller (a single server with no tokens)
    calls: list[tuple[str, str, str, str]] = field(default_factory=list)  # pod, verb, path, auth
    script: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # next POST answers
    status: dict[str, Any] = field(default_factory=dict)
    backups: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, _name: str, _namespace: str, pod: str, _spec: object) -> str:
        return f"{self.base}/pods/{pod}"

    def fail_next(self, status: int, message: str) -> None:
        with self.lock:
            self.script.append((status, {"error": message}))

    def set_status(self, **fields: Any) -> None:
        with self.lock:
            self.status = {**healthy_status(), **fields}

    def posts(self) -> list[tuple[str, str]]:
        """(pod, Authorization header) of each backup asked for."""
        with self.lock:
            return [(pod, auth) for pod, verb, path, auth in self.calls if verb == "POST"]

    def answer(self, pod: str, verb: str, path: str, auth: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls.append((pod, verb, path, auth))
            if self.token is not None and auth != f"Bearer {self.token}":
                return 401, {"error": "unauthorized"}
            if path == "/_archive/status" and verb == "GET":
                return 200, self.status
            if path == "/_archive/backups" and verb == "GET":
                first = self.backups[0] if self.backups else None
                recoverable = (
                    None
                    if first is None
                    else {
                        "first_lsn": first["start_lsn"],
                        "first_time": first["time"],
                        "last_lsn": 99,
                        "last_time": "2026-11-26T05:00:00Z",
                    }
                )
                return 200, {"backups": self.backups, "recoverable": recoverable}
            if path == "/_archive/backups" and verb == "POST":
                if self.script:
                    return self.script.pop(0)
                n = len(self.backups) + 1
                summary = {
                    "id": f"20261126T0400{n:02d}Z-{10 * n:016x}",
                    "term": 1,
                    "start_lsn": 10 * n,
                    "end_lsn": 10 * n + 5,
                    "time": f"2026-11-26T04:00:{n:02d}Z",
                    "started": f"2026-11-26T04:00:{n:02d}Z",
                    "stopped": f"2026-11-26T04:01:{n:02d}Z",
                    "bytes": 4096,
                    "node": pod,
                }
                self.backups.append(summary)
                return 201, summary
            return 404, {"error": f"no {verb} {path}"}


def healthy_status() -> dict[str, Any]:
    """A primary's ``/_archive/status`` while its archive keeps up."""
    return {
        "enabled": True,
        "url": "s3://bucket/events",
        "mode": "async",
        "role": "archiving",
        "archived_lsn": 42,
        "archived_term": 1,
        "durable_lsn": 42,
        "lag_frames": 0,
        "lag_bytes": 0,
        "lag_seconds": 0.4,
        "pending_bytes": 0,
        "failing": False,
        "last_error": None,
        "last_error_kind": None,
        "last_archived_at": "2026-11-26T04:00:00Z",
    }


@contextmanager
def archive_stand_in(token: str | None = None) -> Iterator[ArchiveStandIn]:
    """The stand-in on a free loopback port, for the length of the block."""
    stand_in = ArchiveStandIn(token=token, status=healthy_status())

    class Handler(JsonHandler):
        def _serve(self, verb: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            _, _, pod, *rest = self.path.split("/", 3)
            path = "/" + (rest[0] if rest else "")
            self.send_json(*stand_in.answer(pod, verb, path, self.headers.get("Authorization", "")))

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    with serving(Handler, "archive-stand-in") as base:
        stand_in.base = base
        yield stand_in
