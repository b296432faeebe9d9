"""The admin endpoints' shared pieces: the peer token's check, and ``/_archive/status``,
which every server answers (the archive's state, a follower's, or that there is none).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stream_server.replication.peers import peer_token


def peer_denied(allowed: Callable[[str | None], bool] | None, request: Request) -> Response | None:
    """401 unless the request carries the replica set's token (when it has one);
    None when ``allowed`` is None (no set: anyone)."""
    if allowed is None or allowed(request.headers.get("authorization")):
        return None
    return JSONResponse(
        peer_token.REFUSED,
        status_code=401,
        headers={"www-authenticate": peer_token.CHALLENGE},
    )


def status_route(
    document: Callable[[], dict[str, object]], allowed: Callable[[str | None], bool] | None
) -> Route:
    """``GET /_archive/status``: authenticated as the switchover is (``allowed``)."""

    async def status(request: Request) -> Response:
        if (denied := peer_denied(allowed, request)) is not None:
            return denied
        return JSONResponse(document(), headers={"cache-control": "no-store"})

    return Route("/_archive/status", status, methods=["GET"])
