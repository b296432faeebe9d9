"""A replica set's endpoints and series (docs/replication.md) as a Part.

``/replication/stream`` is answered ahead of Starlette: its connection is handed
over to the primary's sender (``replication/stream_endpoint.py``). The snapshot
and switchover are peer endpoints, behind the set's token when it has one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client.registry import Collector
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from stream_server.node.admin import peer_denied
from stream_server.node.part import Asgi, Part
from stream_server.protocol.http import Receive, Scope, Send
from stream_server.replication import stream_endpoint
from stream_server.replication.replica_metrics import ReplicationCollector
from stream_server.replication.replica_set import Replication


class ReplicationPart(Part):
    def __init__(self, replication: Replication, recovered: Callable[[], bool]) -> None:
        self.replication = replication
        self.recovered = recovered

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/replication", self.status, methods=["GET"]),
            Route("/replication/snapshot", self.snapshot, methods=["GET"]),
            Route("/replication/switchover", self.switchover, methods=["POST"]),
        ]

    def ahead(self) -> dict[str, Asgi]:
        return dict.fromkeys(stream_endpoint.PATHS, self.stream)

    def collectors(self) -> list[Collector]:
        return [ReplicationCollector(self.replication)]

    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        await stream_endpoint.serve(self.replication, scope, send, recovered=self.recovered())

    async def status(self, request: Request) -> JSONResponse:
        """This replica's role, term, primary and positions (docs/replication.md)."""
        return JSONResponse(self.replication.status(), headers={"cache-control": "no-store"})

    async def snapshot(self, request: Request) -> Response:
        """A consistent copy of the data, for a standby that must re-copy."""
        if (denied := peer_denied(self.replication.peer_allowed, request)) is not None:
            return denied
        if not self.recovered():
            return PlainTextResponse("recovery not finished\n", status_code=503)
        path = await self.replication.recopy.serve(request.query_params.get("set", ""))
        if path is None:
            return PlainTextResponse("not the primary\n", status_code=409)
        if not isinstance(path, Path):  # another set's replica (replication/identity.py)
            return Response(path.body, status_code=path.status, headers=path.headers)
        return FileResponse(
            path,
            media_type="application/x-tar",
            background=BackgroundTask(path.unlink, missing_ok=True),
        )

    async def switchover(self, request: Request) -> Response:
        """Hand the primary role to an in-sync standby (docs/replication.md, Switchover)."""
        if (denied := peer_denied(self.replication.peer_allowed, request)) is not None:
            return denied
        answer = await self.replication.switchover_request(await request.body())
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)
