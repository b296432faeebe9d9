"""A group of appends taken in one step (``StreamStore.append_many``, the writer's way
with a worker's frame): one batch entry, each append answered in its own right."""

from __future__ import annotations

import asyncio
import threading

from stream_server.engine import StorageError
from stream_server.streams.errors import StreamClosed, Unavailable
from stream_server.streams.requests import AppendResult
from stream_server.streams.store import (
    AppendItem,
    AppendRequest,
    CreateRequest,
    Producer,
    StreamStore,
)

BIN = "application/octet-stream"


class Held:
    """Each batch, once on the writer thread (``entered``), waits at ``gate``; ``batches``
    gets each batch's ops."""

    def __init__(self) -> None:
        self.entered, self.gate = threading.Event(), threading.Event()
        self.batches: list[list[object]] = []


def held_commits(store: StreamStore, monkeypatch, *, fail: bool = False) -> Held:
    """Batches held at a gate (then failed with ``fail``)."""
    held = Held()
    real = store.engine.commit

    def commit(ops, more=None):
        held.batches.append(list(ops))
        held.entered.set()
        assert held.gate.wait(10)
        if fail:
            raise StorageError("disk full", disk_full=True)
        return real(ops, more)

    monkeypatch.setattr(store.engine, "commit", commit)
    return held


def item(path: str, body: bytes, producer: Producer | None = None, close: bool = False):
    req = AppendRequest(path, BIN, body, producer=producer, close=close)
    return (req, BIN, None)


async def replies_of(store: StreamStore, items: list[AppendItem], held: Held):
    """Each item's outcome by index: what came before the batch was let through, then all."""
    replies: dict[int, AppendResult | BaseException] = {}
    all_in = asyncio.Event()

    def reply(i: int, outcome: AppendResult | BaseException) -> None:
        assert i not in replies, f"append {i} answered twice"
        replies[i] = outcome
        if len(replies) == len(items):
            all_in.set()

    store.append_many(items, reply)
    assert await asyncio.to_thread(held.entered.wait, 10)  # the batch is at the gate
    await asyncio.sleep(0)  # and anything the loop had queued meanwhile has run
    early = dict(replies)
    held.gate.set()
    await asyncio.wait_for(all_in.wait(), 10)
    return early, replies


async def test_a_group_is_one_batch_entry_and_each_append_is_answered_in_its_own_right(
    store, monkeypatch
):
    await store.create(CreateRequest("a", BIN))
    await store.create(CreateRequest("b", BIN))
    await store.create(CreateRequest("c", BIN, closed=True))
    counted: list[int] = []
    store.pipeline.on_batch = lambda stats, requests: counted.append(requests)
    held = held_commits(store, monkeypatch)
    p = Producer("w", 0, 0)
    early, replies = await replies_of(
        store,
        [
            item("a", b"1"),
            item("c", b"x"),  # refused: closed
            item("b", b"2", producer=p),
            item("b", b"2", producer=p),  # a retry of the one before, in the same group
            item("a", b"3"),
        ],
        held,
    )
    # Only the refusal is answered before the batch is durable: not the duplicate,
    # whose original was still on its way.
    assert list(early) == [1] and isinstance(early[1], StreamClosed)
    assert len(held.batches) == 1  # the group went as one entry of one batch
    assert counted == [3]  # and counts as the three write requests it queued
    first, second, dup, last = (replies[i] for i in (0, 2, 3, 4))
    assert isinstance(first, AppendResult) and first.tail == 1 and first.appended
    assert isinstance(second, AppendResult) and second.tail == 1 and second.appended
    assert isinstance(dup, AppendResult) and dup.duplicate and not dup.appended
    assert isinstance(last, AppendResult) and last.tail == 2
    assert first.batch is not None and first.batch.appends == 3
    assert (store.get("a").tail, store.get("b").tail) == (2, 1)
    r = await store.read(store.get("a"), 0, 1 << 20)
    assert r.payloads == [b"1", b"3"]


async def test_a_failed_group_fails_each_of_its_appends_and_changes_nothing(store, monkeypatch):
    await store.create(CreateRequest("a", BIN, b"keep"))
    held = held_commits(store, monkeypatch, fail=True)
    p = Producer("w", 0, 0)
    early, replies = await replies_of(
        store, [item("a", b"1"), item("a", b"2", producer=p), item("a", b"", close=True)], held
    )
    assert early == {}
    assert all(isinstance(r, Unavailable) and r.disk_full for r in replies.values())
    s = store.get("a")
    assert (s.tail, s.pending.tail, s.meta.closed, s.pending.meta.closed) == (4, 4, False, False)
    assert s.producer("w") is None
