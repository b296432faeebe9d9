"""A standby's request for its stream (``replication/peers/peer_http.py``) against real sockets:
the stream after a ``101`` with the bytes that came with it, any other answer read
whole (chunked too) and its connection closed, a header with a line break refused
unsent, and a peer that drops the connection, never answers or cannot be reached."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from stream_server.replication.peers.peer_http import (
    PeerError,
    PeerResponse,
    PeerStream,
    open_stream,
)

pytestmark = pytest.mark.processes

UPGRADE = "pyds-replication/2"
# What the test peer does with one connection: the request's head as it came, and the
# connection's two ends.
Behaviour = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Peer:
    """A raw TCP server on 127.0.0.1 whose answer to each connection a test sets."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.heads: list[bytes] = []  # each connection's request head (b"": none came)
        self.after: list[bytes] = []  # what each connection sent after its head, to EOF
        self.ended = asyncio.Event()  # a connection's client closed its end
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            head = exc.partial
        self.heads.append(head)
        try:
            if head:
                await self.behaviour(head, r, w)
            self.after.append(await r.read())
            self.ended.set()
        finally:
            w.close()


@pytest.fixture
async def peer() -> AsyncIterator[Callable[[Behaviour], Awaitable[Peer]]]:
    servers: list[asyncio.Server] = []

    async def start(behaviour: Behaviour) -> Peer:
        p = Peer(behaviour)
        p.server = await asyncio.start_server(p.handle, "127.0.0.1", 0)
        servers.append(p.server)
        return p

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


async def test_a_101_gives_the_stream_with_the_bytes_that_came_with_it(peer):
    async def switch(head: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n"
            b"upgrade: pyds-replication/2\r\nReplication-Term: 7\r\n\r\nearly bytes"
        )
        w.write(await r.readexactly(3) + b" back")  # the stream, both ways

    p = await peer(switch)
    s = await open_stream(f"{p.url}/replication/stream", {"term": 7}, {}, UPGRADE, within=5)
    assert isinstance(s, PeerStream)
    try:
        assert s.headers["replication-term"] == "7" and s.early == b"early bytes"
        s.writer.write(b"ack")
        assert await s.reader.readexactly(8) == b"ack back"
    finally:
        s.writer.close()
    request = p.heads[0].decode().lower()
    assert request.startswith("get /replication/stream?term=7 http/1.1\r\n")
    assert "connection: upgrade\r\n" in request and f"upgrade: {UPGRADE}\r\n" in request


async def test_another_answer_is_read_whole_and_its_connection_closed(peer):
    async def refuse(head: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(
            b"HTTP/1.1 426 Upgrade Required\r\nupgrade: pyds-replication/3\r\n"
            b"transfer-encoding: chunked\r\n\r\n9\r\nupgrade r\r\n8\r\nequired\n\r\n0\r\n\r\n"
        )

    p = await peer(refuse)
    r = await open_stream(f"{p.url}/replication/stream", {}, {}, UPGRADE, within=5)
    assert r == PeerResponse(
        426,
        {"upgrade": "pyds-replication/3", "transfer-encoding": "chunked"},
        b"upgrade required\n",
    )
    await asyncio.wait_for(p.ended.wait(), 5)  # a liveness bound: the client closed its end


async def test_a_header_with_a_line_break_is_refused_unsent(peer):
    async def never(head: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        raise AssertionError("a request came")

    p = await peer(never)
    evil = {"authorization": "Bearer x\r\nx-evil: 1"}
    with pytest.raises(PeerError, match="line break"):
        await open_stream(f"{p.url}/replication/stream", {}, evil, UPGRADE, within=5)
    await asyncio.wait_for(p.ended.wait(), 5)
    assert p.heads == [b""] and p.after == [b""]  # connected, closed, nothing sent


async def test_a_peer_that_drops_the_connection_is_an_error(peer):
    async def drop(head: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    p = await peer(drop)
    with pytest.raises(PeerError, match="closed the connection"):
        await open_stream(f"{p.url}/replication/stream", {}, {}, UPGRADE, within=5)


async def test_a_peer_that_never_answers_is_an_error_in_time(peer):
    async def silent(head: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()

    p = await peer(silent)
    with pytest.raises(PeerError, match="no answer"):
        await open_stream(f"{p.url}/replication/stream", {}, {}, UPGRADE, within=0.3)


async def test_an_unreachable_peer_is_an_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(PeerError, match="cannot connect"):
        await open_stream(f"http://127.0.0.1:{port}/replication/stream", {}, {}, UPGRADE, within=5)
