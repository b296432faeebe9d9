"""The follower's lean HTTP client (``replication/peer_http.py``) against real sockets:
keep-alive, a connection the peer drops (idle, before answering, mid-body), a peer that
never answers, and the real stream server closing an idle connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import h11
import pytest

from stream_server.replication.peer_http import PeerClient, PeerError

pytestmark = pytest.mark.processes

# What the test server does with the n-th request it reads (0-based, over all connections).
Behaviour = Callable[[int, h11.Request, asyncio.StreamWriter, h11.Connection], Awaitable[bool]]


async def answer(n: int, req: h11.Request, w: asyncio.StreamWriter, conn: h11.Connection) -> bool:
    """A normal keep-alive answer naming the request's number and target."""
    body = f"{n} {req.target.decode()}".encode()
    w.write(conn.send(h11.Response(status_code=200, headers=[("content-length", str(len(body)))])))
    w.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
    await w.drain()
    return True  # keep the connection


class PeerServer:
    """A small HTTP/1.1 server on 127.0.0.1 (h11), whose behaviour per request a test sets."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[h11.Request] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await r.read(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    self.requests.append(event)
                    n = len(self.requests) - 1
                    while not isinstance(conn.next_event(), h11.EndOfMessage):
                        pass  # a GET has no body: its end is in the same bytes
                    if not await self.behaviour(n, event, w, conn):
                        return
                    conn.start_next_cycle()
        finally:
            w.close()


@pytest.fixture
async def peer() -> AsyncIterator[Callable[[Behaviour], Awaitable[PeerServer]]]:
    servers: list[asyncio.Server] = []

    async def start(behaviour: Behaviour) -> PeerServer:
        ps = PeerServer(behaviour)
        ps.server = await asyncio.start_server(ps.handle, "127.0.0.1", 0)
        servers.append(ps.server)
        return ps

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


async def test_requests_share_one_kept_alive_connection(peer):
    ps = await peer(answer)
    client = PeerClient(timeout=5)
    try:
        for i in range(3):
            r = await client.get(f"{ps.url}/replication/peer", params={"a": i, "b": "x y"})
            assert (r.status, r.body) == (200, f"{i} /replication/peer?a={i}&b=x+y".encode())
            assert r.headers["content-length"] == str(len(r.body))
    finally:
        await client.aclose()
    assert (client.connects, ps.connections) == (1, 1)
    assert all(dict(req.headers)[b"host"] == ps.url[7:].encode() for req in ps.requests)


async def test_chunked_answers_and_a_connection_the_peer_closes_are_read_whole(peer):
    """A chunked body is joined; an answer saying ``connection: close`` is read whole
    and its connection is not used again."""

    async def chunked_then_close(n, req, w, conn) -> bool:
        close = n == 1
        headers = [("transfer-encoding", "chunked"), ("x-n", str(n))]
        if close:
            headers.append(("connection", "close"))
        w.write(conn.send(h11.Response(status_code=200, headers=headers)))
        for part in (b"first ", b"second ", str(n).encode()):
            w.write(conn.send(h11.Data(data=part)))
        w.write(conn.send(h11.EndOfMessage()))
        await w.drain()
        return not close

    ps = await peer(chunked_then_close)
    client = PeerClient(timeout=5)
    try:
        got = [await client.get(ps.url + f"/{i}") for i in range(3)]
    finally:
        await client.aclose()
    assert [(r.status, r.body, r.headers["x-n"]) for r in got] == [
        (200, b"first second 0", "0"),
        (200, b"first second 1", "1"),
        (200, b"first second 2", "2"),
    ]
    assert client.connects == 2  # the third request went on a new connection


async def test_a_header_with_a_line_break_is_refused_unsent(peer):
    ps = await peer(answer)
    client = PeerClient(timeout=5)
    try:
        with pytest.raises(PeerError, match="line break"):
            await client.get(ps.url + "/a", headers={"authorization": "Bearer x\r\nx-evil: 1"})
        assert (await client.get(ps.url + "/b")).body == b"0 /b"
    finally:
        await client.aclose()
    assert [r.target for r in ps.requests] == [b"/b"]


async def test_a_connection_dropped_before_the_answer_is_retried_once_on_a_new_one(peer):
    async def drop_second(n, req, w, conn) -> bool:
        if n == 1:
            return False  # read the request, close without a byte of answer
        return await answer(n, req, w, conn)

    ps = await peer(drop_second)
    client = PeerClient(timeout=5)
    try:
        assert (await client.get(ps.url + "/a")).body == b"0 /a"
        # The peer closes the reused connection as the request arrives: sent again.
        assert (await client.get(ps.url + "/b")).body == b"2 /b"
    finally:
        await client.aclose()
    assert [r.target for r in ps.requests] == [b"/a", b"/b", b"/b"]
    assert client.connects == 2


async def test_a_fresh_connection_that_drops_is_an_error_not_a_retry(peer):
    async def drop(n, req, w, conn) -> bool:
        return False

    ps = await peer(drop)
    client = PeerClient(timeout=5)
    with pytest.raises(PeerError):
        await client.get(ps.url + "/a")
    assert len(ps.requests) == 1  # not sent twice: nothing says a retry would fare better


async def test_a_connection_dropped_mid_body_fails_and_the_next_request_reconnects(peer):
    async def half(n, req, w, conn) -> bool:
        if n == 0:
            w.write(conn.send(h11.Response(status_code=200, headers=[("content-length", "100")])))
            w.write(conn.send(h11.Data(data=b"0123456789")))
            await w.drain()
            return False
        return await answer(n, req, w, conn)

    ps = await peer(half)
    client = PeerClient(timeout=5)
    try:
        with pytest.raises(PeerError):
            await client.get(ps.url + "/a")  # part of an answer: never retried
        assert (await client.get(ps.url + "/b")).body == b"1 /b"
    finally:
        await client.aclose()
    assert client.connects == 2


async def test_a_peer_that_never_answers_times_out(peer):
    async def silent(n, req, w, conn) -> bool:
        await asyncio.sleep(30)
        return False

    ps = await peer(silent)
    client = PeerClient(timeout=0.3)
    with pytest.raises(PeerError, match="no answer"):
        await client.get(ps.url + "/a")


async def test_an_unreachable_peer_is_an_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(PeerError, match="cannot connect"):
        await PeerClient(timeout=5).get(f"http://127.0.0.1:{port}/a")


async def test_the_real_server_closing_an_idle_connection_costs_no_error(server_factory):
    """The stream server closes a connection idle past --keep-alive-timeout; the next
    request sees that before sending and connects anew."""
    srv = server_factory()
    srv.args += ["--keep-alive-timeout", "0.5"]
    srv.start()
    client = PeerClient(timeout=5)
    try:
        assert (await client.get(f"{srv.url}/healthz")).status == 200
        await asyncio.sleep(1.5)
        assert (await client.get(f"{srv.url}/healthz")).status == 200
    finally:
        await client.aclose()
    assert client.connects == 2
