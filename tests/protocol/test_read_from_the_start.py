"""A catch-up read from the start (offset -1) that retention overtakes, between the
earliest offset being looked up and the data being read, answers 200 from the new
start: the client asked for the earliest retained data, which is never gone. An offset
the client named below the start is still 410.

A worker reads the data directory as of the snapshot it opened, and meets an overtaking
drop only where the drop's punched blocks are (``workers/local_reads.py``); the same
retry then applies, in the same protocol code."""

from __future__ import annotations

CT = {"Content-Type": "application/octet-stream"}
CHUNK = b"r" * 1024
BOUND = 8 * 1024


async def test_a_read_from_the_start_overtaken_by_retention_reads_from_the_new_start(
    async_app_server, monkeypatch
):
    srv = await async_app_server("--retention", f"r/:max-bytes={BOUND}")
    store = srv.app.store
    store.retention.stop()  # drops happen when this test says, not on their own
    http, url = srv.client, f"{srv.base}r/one"
    assert (await http.put(url, headers=CT)).status_code == 201
    for _ in range(12):  # 12 KiB into an 8 KiB bound: within the sweeper's slack
        assert (await http.post(url, headers=CT, content=CHUNK)).status_code == 204
    overtaken: list[int] = []
    real = store.read

    async def overtaken_read(s, start, max_bytes):
        if not overtaken:  # retention drops the head after the start was looked up
            overtaken.append(await store.retention.sweep())
        return await real(s, start, max_bytes)

    monkeypatch.setattr(store, "read", overtaken_read)
    r = await http.get(url, params={"offset": "-1"})
    assert overtaken == [1]  # the drop did come between the lookup and the read
    assert r.status_code == 200, r.text
    assert 0 < len(r.content) <= BOUND and set(r.content) == {ord("r")}
    assert r.headers["stream-up-to-date"] == "true"
    gone = await http.get(url, params={"offset": "0000000000000000_0000000000000000"})
    assert gone.status_code == 410  # a named offset below the start is gone
