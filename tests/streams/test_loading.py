"""A start makes every stored stream servable without copying its state.

At 1M streams the start built a ``Stream`` per stream on the event loop,
each with a copy of its metadata for queued changes (``Pending``) and an
empty set of live readers: about 12 us and 800 bytes a stream, 9.5 s of the
start outside the recovery timer. A stream that no write and no live
reader has touched needs neither: they are made on first use, and a failed
batch's rollback drops them instead of copying every stream again.
"""

from __future__ import annotations

import pytest

from stream_server.engine import StorageError
from stream_server.streams.errors import Unavailable
from stream_server.streams.store import AppendRequest, CreateRequest, StreamStore

BIN = "application/octet-stream"


async def loaded(tmp_path, paths: list[str]) -> StreamStore:
    """A store started on a directory where ``paths`` were created with one append each."""
    first = StreamStore(tmp_path / "data")
    await first.start()
    for p in paths:
        await first.create(CreateRequest(p, BIN, b"a"))
        await first.append(AppendRequest(p, BIN, b"b"))
    await first.stop()
    store = StreamStore(tmp_path / "data")
    await store.start()
    return store


async def test_loaded_streams_hold_no_pending_copy_and_no_waiter_set(tmp_path):
    store = await loaded(tmp_path, ["a", "b", "c"])
    try:
        assert store.load_seconds > 0  # counted apart from the engine's recovery
        for s in store.streams.values():
            assert s._pending is None and s.waiters is None, s.path
        s = store.streams["a"]
        assert s.pending.meta == s.meta and s.pending.tail == s.tail == 2
        assert (await store.append(AppendRequest("a", BIN, b"c"))).tail == 3
        assert store.streams["b"]._pending is None  # the write made a's only
    finally:
        await store.stop()


async def test_a_rollback_leaves_every_stream_at_its_committed_state(tmp_path, monkeypatch):
    store = await loaded(tmp_path, ["a", "b"])
    try:
        await store.append(AppendRequest("a", BIN, b"c"))  # a's pending state exists
        real = store.engine.commit

        def fail(ops, more=None):
            raise StorageError("injected")

        monkeypatch.setattr(store.engine, "commit", fail)
        with pytest.raises(Unavailable):
            await store.append(AppendRequest("b", BIN, b"lost"))
        monkeypatch.setattr(store.engine, "commit", real)
        for s in store.streams.values():
            assert s.pending.meta == s.meta and s.pending.tail == s.tail, s.path
        assert store.streams["b"].tail == 2
        assert (await store.append(AppendRequest("b", BIN, b"d"))).tail == 3
    finally:
        await store.stop()
