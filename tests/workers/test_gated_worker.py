"""A worker on a replica set's member (``WorkerApp.gated``): it serves a request itself
when the writer would let it through at once, and relays the rest whole, so the writer
answers them as a single process does: a write the writer refuses (a standby's) or
would wait on, a read while the replica is stale (its read gate is the writer's), and
every live read (its wait ends when the replica goes stale, which the writer sees)."""

from __future__ import annotations

import asyncio

from stream_server.node.part import Part
from stream_server.protocol import http as http_helpers
from stream_server.protocol.refusal import Refusal

CT = {"Content-Type": "application/octet-stream"}
STANDBY = Refusal(
    503,
    [(b"retry-after", b"1"), (b"stream-primary", b"http://primary:4437/v1/stream/")],
    b"this replica is a standby; write to the primary at http://primary:4437/v1/stream/\n",
)


class Standby(Part):
    """A Part of the writer's that refuses every write, as a standby's topology does."""

    refuses_writes = True

    def write_refusal(self) -> Refusal:
        return STANDBY


async def gated_worker(async_app_server, monkeypatch):
    """A worker as on a replica set's member (``gated``), and the list of what it relays
    to the writer: (method, path, query string)."""
    srv = await async_app_server(worker=True)
    worker = srv.worker
    worker.gated = True
    relayed: list[tuple[str, str, bytes]] = []
    relay = worker.proxy

    async def counted(scope, receive, send):
        relayed.append((scope["method"], scope["path"], scope["query_string"]))
        await relay(scope, receive, send)

    monkeypatch.setattr(worker, "proxy", counted)  # undone before the worker stops
    return srv, relayed


async def test_writes_taken_at_once_are_served_by_the_worker_the_rest_by_the_writer(
    async_app_server, monkeypatch
):
    srv, relayed = await gated_worker(async_app_server, monkeypatch)
    http, url = srv.client, f"{srv.base}gated"
    assert (await http.put(url, headers=CT)).status_code == 201
    assert (await http.post(url, headers=CT, content=b"ab")).status_code == 204
    assert relayed == []  # the writer takes writes at once: the worker served both
    read = await http.get(url, params={"offset": "-1"})
    assert read.status_code == 200 and read.content == b"ab"
    assert relayed == []  # the replica is current: the worker served the read too

    # The writer now refuses writes, as a standby does: the worker relays the write
    # and the client gets the writer's own refusal, headers and body.
    refusers = srv.app.refusers
    srv.app.refusers, srv.app.refuses_writes = [Standby()], True
    refused = await http.post(url, headers=CT, content=b"cd")
    assert refused.status_code == 503
    assert refused.headers["stream-primary"] == "http://primary:4437/v1/stream/"
    assert refused.headers["retry-after"] == "1"
    assert refused.content == STANDBY.body
    assert relayed == [("POST", "/v1/stream/gated", b"")]
    srv.app.refusers, srv.app.refuses_writes = refusers, False
    assert (await http.post(url, headers=CT, content=b"ef")).status_code == 204
    assert relayed == [("POST", "/v1/stream/gated", b"")]  # served by the worker again
    assert srv.app.store.get("gated").tail == 4  # ab and ef: the refused write changed nothing


class StaleGate:
    """The writer's read gate of a replica that fell behind its staleness bound."""

    REFUSAL = (503, [(b"retry-after", b"1")], b'{"error": {"code": "STALE_REPLICA"}}')

    def fresh_for(self) -> float:
        return 0.0

    def read_refusal(self):
        return self.REFUSAL

    def stale(self) -> asyncio.Future[None]:
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def test_reads_are_served_by_the_worker_while_current_and_live_reads_by_the_writer(
    async_app_server, monkeypatch
):
    srv, relayed = await gated_worker(async_app_server, monkeypatch)
    http, url = srv.client, f"{srv.base}reads"
    assert (await http.put(url, headers=CT, content=b"abc")).status_code == 201
    assert (await http.head(url)).status_code == 200
    parsed: list[str] = []
    real_parse = http_helpers.parse_qsl
    monkeypatch.setattr(
        http_helpers, "parse_qsl", lambda qs, **kw: parsed.append(qs) or real_parse(qs, **kw)
    )
    read = await http.get(url, params={"offset": "-1"})
    assert (read.status_code, read.content) == (200, b"abc")
    assert read.headers["stream-up-to-date"] == "true"
    assert relayed == []  # current: both served by the worker
    assert parsed == ["offset=-1"]  # the gate and the route read one parse of the query

    # A live read goes to the writer, whose wait the replica going stale would end.
    tail = read.headers["stream-next-offset"]
    poll = asyncio.ensure_future(http.get(url, params={"offset": tail, "live": "long-poll"}))
    assert (await http.post(url, headers=CT, content=b"d")).status_code == 204
    woken = await poll
    assert (woken.status_code, woken.content) == (200, b"d")
    assert relayed == [("GET", "/v1/stream/reads", f"offset={tail}&live=long-poll".encode())]

    # Stale: the writer's refusal, exactly, for a read the worker would have served.
    monkeypatch.setattr(srv.app.streams.context, "read_gate", StaleGate())
    refused = await http.get(url, params={"offset": "-1"})
    status, _, body = StaleGate.REFUSAL
    assert (refused.status_code, refused.content) == (status, body)
    assert refused.headers["retry-after"] == "1"
    assert relayed[-1] == ("GET", "/v1/stream/reads", b"offset=-1")
    assert len(relayed) == 2
