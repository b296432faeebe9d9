"""A stream request that arrives once the store has stopped gets a 503, not a traceback.

The store stops before the process ends while the socket still takes requests: in a
graceful stop, and when a standby installs a re-copy and execs itself again
(replication/recopy.py), where a replica-set fault run found a reader's GET
failing inside the app with "cannot schedule new futures after shutdown". The
client must get what it gets during recovery: 503 with Retry-After, so it tries
again or elsewhere, and nothing is changed.
"""

from __future__ import annotations

from testkit.asgi import in_process

CT = {"content-type": "application/octet-stream"}


async def test_reads_and_writes_after_the_store_stopped_are_refused_with_503(tmp_path):
    async with in_process(tmp_path / "data") as server:
        c = server.client
        assert (await c.put(f"{server.base}s", headers=CT, content=b"ab")).status_code == 201
        await server.app.store.stop()
        for r in (
            await c.get(f"{server.base}s?offset=-1"),
            await c.post(f"{server.base}s", headers=CT, content=b"cd"),
            await c.put(f"{server.base}t", headers=CT),
        ):
            assert r.status_code == 503, (r.request.method, r.status_code, r.text)
            assert r.headers["retry-after"]
            assert "stopping" in r.text
    async with in_process(tmp_path / "data") as again:
        r = await again.client.get(f"{again.base}s?offset=-1")
        assert r.content == b"ab"  # the refused append changed nothing
        assert (await again.client.head(f"{again.base}t")).status_code == 404
