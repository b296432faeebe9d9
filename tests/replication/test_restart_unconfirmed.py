"""A standby that starts holding frames past the last commit point it heard serves none
of them until its primary confirms them, nor a frame it received since, in a stream it
loads from LMDB meanwhile (docs/replication.md, "Reads").

Recovery loads everything the data directory holds, and the commit point a standby
heard before a restart (or a re-copy, which restarts it) is not kept: its readers see
a tail that a later election may still roll back. The real app on a real data
directory (a standby's engine that applied three frames of a term-2 primary), its real
role loop on the emulated API server, its real follower, and a primary played by the
test over the replication stream's bytes, which decides what commit point it announces.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.replica import commit_frames, write_frames
from stream_server.replication.peers import wire
from testkit import wait_until
from testkit.asgi import InProcessServer, in_process
from testkit.cluster import Cluster
from testkit.replica_engines import primary_frames, standby

TERM = 2  # the term of the played primary's frames (``primary_frames``)
WAIT = 60.0  # seconds: a liveness bound, never reached when the code is right


class PlayedPrimary:
    """The primary's end of one replication stream: the 101, then whatever commit points
    the test sends; every acknowledgement the standby sends is queued."""

    def __init__(self, fourth: bytes) -> None:
        self.acks: asyncio.Queue[tuple[int, int, int, int]] = asyncio.Queue()
        self.writer: asyncio.StreamWriter | None = None
        self.fourth = fourth  # the frame at lsn 4: "!!" appended, which the standby lacks

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(f"GET {wire.STREAM_PATH}?".encode()), head
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n"
            + f"upgrade: {wire.UPGRADE}\r\n{wire.TERM}: {TERM}\r\n\r\n".encode()
        )
        self.writer = writer
        while True:
            try:
                raw = await reader.readexactly(wire.ACK.size)
            except asyncio.IncompleteReadError:
                return
            await self.acks.put(wire.ACK.unpack(raw))

    async def ack(self) -> tuple[int, int, int, int]:
        return await asyncio.wait_for(self.acks.get(), WAIT)

    async def announce(
        self, commit: int, echo: int, frame: bytes = b""
    ) -> tuple[int, int, int, int]:
        """The commit point (with the frame at lsn 4, if given), echoing ``echo``; the
        standby's answer, sent once it has taken the message in."""
        assert self.writer is not None
        self.writer.write(
            wire.message(TERM if frame else 0, 4 if frame else 0, commit, echo, frame)
        )
        return await self.ack()


def four_batches(e: Engine) -> None:
    """A stream created, "hello ", "world", then "!!": frames at lsn 1 to 4."""
    meta = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)
    e.commit([CreateLog(1, 0), PutStream("a", meta)])
    for data in (b"hello ", b"world", b"!!"):
        e.commit([Append(1, KIND_BYTES, [data])])


def lease_object(name: str, primary_url: str) -> dict[str, object]:
    """The Lease as the played primary ``p`` holds it in ``TERM``, with nobody in sync:
    the standby under test is never eligible, and only follows."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {
                "streams.pyds.dev/term": str(TERM),
                "streams.pyds.dev/primary-url": primary_url,
                "streams.pyds.dev/in-sync": "[]",
            },
        },
        "spec": {"holderIdentity": "p", "leaseDurationSeconds": 15},
    }


@pytest.fixture
async def restarted(
    api: Cluster, lease: str, tmp_path: Path
) -> AsyncIterator[tuple[InProcessServer, PlayedPrimary]]:
    """A standby's data directory holding stream ``a`` = "hello world" up to lsn 3 (the
    create, "hello ", "world"), started (as uvicorn starts the app) as a replica set's
    member whose primary is the test's."""
    data = tmp_path / "data"
    frames = primary_frames(tmp_path / "primary", four_batches)
    e, hooks = standby(data)
    written = write_frames(e, hooks, frames[:3])
    assert written is not None
    commit_frames(e, written)
    e.close()
    primary = PlayedPrimary(frames[3])
    server = await asyncio.start_server(primary.serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    api.create(lease_object(lease.partition("/")[2], url)).raise_for_status()
    flags = [
        "--replication-lease", lease,
        "--replica-name", "r1",
        "--replica-url", "http://127.0.0.1:1",
        "--kube-api", api.url,
        "--lease-retry-period", "0.2",
    ]  # fmt: skip
    try:
        async with in_process(data, *flags) as app:
            yield app, primary
    finally:
        server.close()


async def test_a_restarted_standby_serves_nothing_past_the_commit_point_it_heard(restarted):
    """Before it stopped, the standby had heard commit point 2: "world" (lsn 3) was never
    confirmed. The primary, current and vouching, says so again; the standby must not
    answer a read that shows "world" until a commit point covers it."""
    server, primary = restarted
    first = await primary.ack()  # the stream opened: its position, and a stamp
    assert first[:2] == (TERM, 3)
    stamp = (await primary.announce(2, echo=first[3]))[3]
    r = await server.client.get("/v1/stream/a", params={"offset": "-1"})
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.headers["stream-primary"].startswith("http://127.0.0.1:")
    error = r.json()["error"]
    assert error["code"] == "STALE_REPLICA"
    assert "holds writes up to lsn 3 that no commit point it heard covers" in error["message"]
    assert server.app.replication.status()["fresh_for"] == 0
    # The primary confirms the tail: current, and the whole stream is served.
    await primary.announce(3, echo=stamp)
    r = await server.client.get("/v1/stream/a", params={"offset": "-1"})
    assert r.status_code == 200 and r.content == b"hello world"
    assert r.headers["stream-up-to-date"] == "true"


async def test_a_stream_first_read_after_a_restart_shows_nothing_past_the_commit_point(
    restarted,
):
    """Current again (commit point 3 covers all it held), the standby receives "!!" (lsn
    4) with commit point 3 still: applied to LMDB, not to be seen. No stream is loaded
    after a start: the first read loads "a" from LMDB, where lsn 4 already is."""
    server, primary = restarted
    stamp = (await primary.ack())[3]
    stamp = (await primary.announce(3, echo=stamp))[3]
    await primary.announce(3, echo=stamp, frame=primary.fourth)
    app = server.app
    mirror = app.replication.mirror

    def staged() -> bool:  # LMDB holds lsn 4, the stream layer has it staged
        return any(lsn == 4 for lsn, _ in mirror.staged)

    await wait_until(staged, within=WAIT, message="frame 4 applied and staged")
    assert app.store.engine.tails[1].unit == len(b"hello world!!")
    assert "a" not in app.store.table.by_path
    r = await server.client.get("/v1/stream/a", params={"offset": "-1"})
    assert r.status_code == 200 and r.content == b"hello world", r.content
    stamp = (await primary.announce(3, echo=stamp))[3]
    await primary.announce(4, echo=stamp)  # confirmed
    r = await server.client.get("/v1/stream/a", params={"offset": "-1"})
    assert r.status_code == 200 and r.content == b"hello world!!"
    assert not mirror.held
