"""A worker on a replica set's member (``WorkerApp.gated``): it serves a write itself
when the writer would take it at once, and relays the rest whole, so the writer
answers them as a single process does: every read (its read gate is the writer's),
and a write the writer refuses (a standby's) or would wait on."""

from __future__ import annotations

from stream_server.replication.write_fence import Refusal

CT = {"Content-Type": "application/octet-stream"}
STANDBY = Refusal(
    503,
    [(b"retry-after", b"1"), (b"stream-primary", b"http://primary:4437/v1/stream/")],
    b"this replica is a standby; write to the primary at http://primary:4437/v1/stream/\n",
)


async def test_writes_taken_at_once_are_served_by_the_worker_the_rest_by_the_writer(
    async_app_server, monkeypatch
):
    srv = await async_app_server(worker=True)
    worker = srv.worker
    worker.gated = True  # as on a replica set's member
    relayed: list[tuple[str, str]] = []
    relay = worker.proxy

    async def counted(scope, receive, send):
        relayed.append((scope["method"], scope["path"]))
        await relay(scope, receive, send)

    monkeypatch.setattr(worker, "proxy", counted)  # undone before the worker stops
    http, url = srv.client, f"{srv.base}gated"
    assert (await http.put(url, headers=CT)).status_code == 201
    assert (await http.post(url, headers=CT, content=b"ab")).status_code == 204
    assert relayed == []  # the writer takes writes at once: the worker served both
    read = await http.get(url, params={"offset": "-1"})
    assert read.status_code == 200 and read.content == b"ab"
    assert relayed == [("GET", "/v1/stream/gated")]  # a read waits on the writer's gate

    # The writer now refuses writes, as a standby does: the worker relays the write
    # and the client gets the writer's own refusal, headers and body.
    srv.app.local_write_refusal = lambda: STANDBY
    srv.app.refuses_writes = True
    refused = await http.post(url, headers=CT, content=b"cd")
    assert refused.status_code == 503
    assert refused.headers["stream-primary"] == "http://primary:4437/v1/stream/"
    assert refused.headers["retry-after"] == "1"
    assert refused.content == STANDBY.body
    assert relayed[-1] == ("POST", "/v1/stream/gated")
    srv.app.local_write_refusal = None
    srv.app.refuses_writes = False
    assert (await http.post(url, headers=CT, content=b"ef")).status_code == 204
    assert relayed[-1] == ("POST", "/v1/stream/gated")  # served by the worker again
    assert len(relayed) == 2
    assert srv.app.store.get("gated").tail == 4  # ab and ef: the refused write changed nothing
