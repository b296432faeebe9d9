"""PUT: create a stream, or fork one, or confirm that an identical one exists.

Everything a create needs is checked here before the body is read (TTL and
expiry are exclusive, fork headers need a source), so a bad request costs
no upload. The store decides between 201 (created), 200 (the same stream
already exists) and 409 (a different one does); ``Location`` is sent only
on 201, as the absolute URL the client used.
"""

from __future__ import annotations

from stream_format.offsets import START, format_offset
from stream_server.protocol.context import (
    CACHE_NONE,
    TRUE,
    Context,
    content_type,
    offset_unit,
    raw_path,
)
from stream_server.protocol.headers import (
    CACHE_CONTROL,
    CONTENT_TYPE,
    HOST,
    LOCATION,
    STREAM_CLOSED,
    STREAM_EXPIRES_AT,
    STREAM_FORK_OFFSET,
    STREAM_FORK_SUB_OFFSET,
    STREAM_FORKED_FROM,
    STREAM_NEXT_OFFSET,
    STREAM_TTL,
    is_true,
    non_negative_int,
    parse_expires_at,
    parse_ttl,
)
from stream_server.protocol.http import (
    Headers,
    Receive,
    Scope,
    Send,
    respond,
    socket_authority,
)
from stream_server.streams.errors import BadRequest
from stream_server.streams.requests import CreateRequest, ForkRequest


async def put(
    ctx: Context,
    scope: Scope,
    receive: Receive,
    send: Send,
    path: str,
    h: dict[str, str],
    client: str,
) -> None:
    ttl = parse_ttl(h.get(STREAM_TTL.key))
    expires = parse_expires_at(h.get(STREAM_EXPIRES_AT.key))
    if ttl is not None and expires is not None:
        raise BadRequest("send Stream-TTL or Stream-Expires-At, not both")
    fork = _fork_request(ctx, h)
    body = await ctx.read_body(receive, h)
    result = await ctx.store.create(
        CreateRequest(
            path=path,
            content_type=content_type(h),
            body=body,
            ttl=ttl,
            expires_at=expires[0] if expires else None,
            expires_at_ts=expires[1] if expires else None,
            closed=is_true(h.get(STREAM_CLOSED.key)),
            fork=fork,
        )
    )
    s = result.stream
    hs: Headers = [
        (CONTENT_TYPE.raw, s.meta.content_type.encode()),
        (STREAM_NEXT_OFFSET.raw, format_offset(result.tail).encode()),
        (CACHE_CONTROL.raw, CACHE_NONE),
    ]
    if result.closed:
        hs.append((STREAM_CLOSED.raw, TRUE))
    if result.created:
        hs.append((LOCATION.raw, _absolute_url(scope, h, raw_path(scope)).encode()))
    await respond(send, 201 if result.created else 200, hs)


def _fork_request(ctx: Context, h: dict[str, str]) -> ForkRequest | None:
    """The fork a PUT asks for (a source and where to branch), or None for a plain create."""
    source = h.get(STREAM_FORKED_FROM.key)
    if source is None:
        if STREAM_FORK_OFFSET.key in h or STREAM_FORK_SUB_OFFSET.key in h:
            raise BadRequest("Stream-Fork-Offset needs Stream-Forked-From")
        return None
    fork = ForkRequest(ctx.source_path(source), None)
    raw_offset = h.get(STREAM_FORK_OFFSET.key)
    if raw_offset is not None:
        fork.offset = offset_unit(raw_offset.strip(), allow_now=False)
        if fork.offset == START:
            fork.offset = 0
    sub = h.get(STREAM_FORK_SUB_OFFSET.key)
    if sub is not None:
        fork.sub_offset = non_negative_int(sub.strip(), "Stream-Fork-Sub-Offset")
    return fork


def _absolute_url(scope: Scope, h: dict[str, str], path: bytes) -> str:
    host = h.get(HOST.key)
    if host is None:
        host = socket_authority(scope, ("localhost", None))
    return f"{scope.get('scheme', 'http')}://{host}{path.decode('latin-1')}"
