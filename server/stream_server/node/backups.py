"""``POST /_archive/backups`` (take a base backup now) and ``GET /_archive/backups``
(the catalog), outside the streams' base path (docs/backup.md).

Both are admin endpoints, authenticated as the switchover endpoint is: in a replica
set, the set's token (``--replication-token-file``) when it has one; a single node
asks for that token too when the file is given, and answers anyone otherwise, as
the other admin endpoints do. One backup at a time: a second ``POST`` while one
runs gets 409. The backup runs on a worker thread; the retention policy
(``--backup-retention``) is applied after each one.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from stream_format.archive import ArchiveDamaged
from stream_server.archive.backup import base_backup, catalog
from stream_server.archive.object_store import ArchiveError, ObjectStore
from stream_server.node.archive_part import ArchivePart
from stream_server.node.service_part import Node, ServicePart
from stream_server.replication.peers.peer_token import CHALLENGE, REFUSED, PeerToken

log = logging.getLogger("stream_server.archive")

PATH = "/_archive/backups"


class BackupsPart(ServicePart):
    """On every server: without an archive it says there is none, on a replica
    cluster's server that its source takes them."""

    def __init__(self, node: Node) -> None:
        self.settings = settings = node.settings
        self.engine = node.store.engine
        self.recovery = node.recovery
        archive = node.part(ArchivePart)
        # Told after each backup taken here (the archiver's metric of the newest backup).
        self.taken = archive.backup_taken if archive is not None else None
        allowed = node.topology.peer_allowed
        if allowed is None and settings.replication_token_file:
            allowed = PeerToken(settings.replication_token_file).allows
        self.allowed = allowed
        self.name = settings.replica_name or socket.gethostname()  # in the manifest
        self._store: ObjectStore | None = None
        self._running = threading.Lock()

    def routes(self) -> list[BaseRoute]:
        return [
            Route(PATH, self.take, methods=["POST"]),
            Route(PATH, self.list, methods=["GET"]),
        ]

    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore(self.settings)
        return self._store

    def _refused(self, request: Request) -> Response | None:
        if self.allowed is not None and not self.allowed(request.headers.get("authorization")):
            return JSONResponse(REFUSED, status_code=401, headers={"www-authenticate": CHALLENGE})
        if not self.settings.archive_url:
            return JSONResponse({"error": "no archive configured (--archive-url)"}, status_code=409)
        return None

    async def take(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if self.settings.archive_follow:
            # Its archive is the source's: a second writer there would fork its history.
            return JSONResponse(
                {"error": "a replica cluster takes no backups: its source's primary does"},
                status_code=409,
            )
        if not self.recovery.finished:
            return JSONResponse({"error": "recovery not finished"}, status_code=503)
        if not self._running.acquire(blocking=False):
            return JSONResponse({"error": "a backup is running"}, status_code=409)
        try:
            return await asyncio.to_thread(self._take)
        finally:
            self._running.release()

    def _take(self) -> Response:
        try:
            manifest = base_backup.take(self.engine, self.store(), node=self.name)
        except (ArchiveError, ArchiveDamaged) as exc:
            log.error("base backup failed: %s", exc)
            return JSONResponse({"error": f"base backup failed: {exc}"}, status_code=503)
        answer: dict[str, Any] = catalog.summary(manifest)
        if self.taken is not None:
            self.taken()
        if self.settings.backup_retention:
            try:
                pruned = catalog.prune(self.store(), self.settings.backup_retention)
                answer["retention"] = pruned.json()
            except (ArchiveError, ArchiveDamaged) as exc:
                log.error("backup retention failed: %s", exc)
                answer["retention"] = {"error": str(exc)}
        return JSONResponse(answer, status_code=201)

    async def list(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            doc = await asyncio.to_thread(catalog.listing, self.store())
        except (ArchiveError, ArchiveDamaged) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse(doc, headers={"cache-control": "no-store"})
