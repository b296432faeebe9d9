"""Reads answered only while current (docs/replication.md, "Reads"), in process: the
freshness arithmetic, a deposed primary's, the stream's echo (stamps echoed, none
while the primary may not acknowledge), and the read
gate of the real app object as uvicorn calls it: 503 with its headers for every
read of a replica that cannot show it is current, and live reads that end rather
than say up to date once it falls behind."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from stream_server.app import StreamServerApp
from stream_server.config import Settings
from stream_server.replication.lease.roles import RoleConfig, RoleLoop
from stream_server.replication.peers.wire import ACK, MESSAGE
from stream_server.replication.primary.frame_ring import FrameRing
from stream_server.replication.primary.sender import Sender
from stream_server.replication.standby.freshness import Freshness
from stream_server.replication.standby.receiver import _messages

S = 1_000_000_000  # ns


class Clock:
    def __init__(self, ns: int) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def test_a_stamp_older_than_the_bound_is_stale_and_a_newer_one_fresh_for_the_rest() -> None:
    clock = Clock(100 * S)
    f = Freshness(5.0, clock)
    assert f.fresh_for() == 0 and f.age() is None  # never heard: stale
    f.heard(90 * S, commit=10, visible=10)
    assert f.fresh_for() == 0 and f.age() == 10.0  # current as of 10 s ago, bound 5 s
    f.heard(98 * S, commit=10, visible=10)
    assert f.fresh_for() == pytest.approx(3.0)
    f.heard(0, commit=50, visible=50)  # no echo (a deposed primary's message): nothing
    f.heard(97 * S, commit=10, visible=10)  # older than what we know: nothing
    assert f.current_at == 98 * S
    # An answer whose commit point is not visible here yet counts once it is.
    f.heard(99 * S, commit=20, visible=10)
    assert f.current_at == 98 * S
    f.visible(19)
    assert f.current_at == 98 * S
    f.visible(20)
    assert f.current_at == 99 * S and f.fresh_for() == pytest.approx(4.0)
    clock.ns = 104 * S + 1
    assert f.fresh_for() == 0  # past the bound with nothing newer


def test_a_newer_visible_answer_supersedes_older_ones_still_waiting() -> None:
    clock = Clock(100 * S)
    f = Freshness(5.0, clock)
    f.heard(95 * S, commit=30, visible=10)  # never made visible (say, a term that ended)
    f.heard(96 * S, commit=12, visible=12)
    assert f.current_at == 96 * S
    f.visible(40)
    assert f.current_at == 96 * S  # the older one was dropped, not taken late


def test_readers_that_see_past_every_commit_point_heard_are_current_only_once_one_covers_it():
    """``hold``: a standby that starts (or steps down) showing its readers up to lsn 30,
    which no commit point it heard covers, is stale until an answer's commit point
    does, however fresh the answers' stamps."""
    clock = Clock(100 * S)
    f = Freshness(5.0, clock)
    f.heard(99 * S, commit=10, visible=10)
    assert f.fresh_for() > 0
    f.hold(30)  # current no longer, from now on
    assert f.fresh_for() == 0 and f.holding
    f.heard(99 * S + 1, commit=20, visible=30)  # fresh, but "21..30" may be rolled back
    assert f.fresh_for() == 0 and f.holding and f.commit == 20
    f.visible(30)
    assert f.fresh_for() == 0
    f.heard(99 * S + 2, commit=30, visible=30)  # confirmed
    assert not f.holding and f.fresh_for() == pytest.approx(4.0)
    f.hold(25)  # a lower mark changes nothing it was waiting for
    assert f.unconfirmed == 30 and not f.holding


class FakeClient:
    async def close(self) -> None:
        pass


def test_a_primary_past_its_renew_deadline_may_not_acknowledge_nor_vouch_for_reads() -> None:
    now = [1000.0]
    roles = RoleLoop(
        FakeClient(),  # type: ignore[arg-type]
        RoleConfig("r0", "http://r0", lease_duration=3, renew_deadline=2, retry_period=0.3),
        clock=lambda: now[0],
    )
    assert roles.acknowledge_for == 0  # a standby
    roles.state.role = "primary"
    roles._renewed_at = now[0]
    assert roles.may_acknowledge and roles.acknowledge_for == 2.0
    now[0] += 1.5
    assert roles.acknowledge_for == pytest.approx(0.5)
    now[0] += 0.5
    assert not roles.may_acknowledge and roles.acknowledge_for == 0


# -- the stream's version 2 ---------------------------------------------------------------


class FakeRoles:
    def __init__(self) -> None:
        self.state = type("State", (), {"term": 3})()


class FakeShipper:
    def __init__(self) -> None:
        self.roles = FakeRoles()
        self.vouching = True  # primary of the term, renewed within the renew deadline
        self.ring = FrameRing()
        self.senders: set[Sender] = set()
        self.shipped = 0
        self.committed = 0
        self.noted: list[tuple[str, int, int]] = []
        self.lost: list[tuple[str, int]] = []  # streams ended (``Shipper.stream_lost``)

    @property
    def lsn(self) -> int:
        return self.ring[-1][1] if self.ring else 0

    @property
    def echoing(self) -> bool:
        return self.vouching  # settled: nothing unconfirmed taken over

    def announced(self) -> int:
        return self.committed

    def refusal(self, term: int, after_term: int, after_lsn: int) -> None:
        return None

    def note(self, name: str, after_term: int, after_lsn: int) -> None:
        self.noted.append((name, after_term, after_lsn))

    def stream_lost(self, name: str, term: int) -> None:
        self.lost.append((name, term))


class Transport:
    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data = bytes(self.out)
        self.out.clear()
        return data


async def parse(data: bytes) -> tuple[list[tuple[int, int, bytes]], int, int]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    return await _messages(reader, bytearray())


async def test_the_stream_echoes_the_newest_stamp_while_the_primary_may_acknowledge() -> None:
    shipper = FakeShipper()
    shipper.ring.append((3, 1, b"frame-one"))
    shipper.committed = 1
    sender = Sender(shipper, "r1", 0, 0, heartbeat=60.0)  # type: ignore[arg-type]
    transport = Transport()
    sender.connection_made(transport)  # type: ignore[arg-type]
    try:
        # Nothing received yet: echo 0.
        frames, commit, echo = await parse(transport.take())
        assert (frames, commit, echo) == ([(3, 1, b"frame-one")], 1, 0)
        # Two acknowledgements in one read: the newest stamp counts.
        sender.data_received(ACK.pack(3, 1, 1, 7 * S) + ACK.pack(3, 1, 1, 8 * S))
        assert shipper.noted[-1] == ("r1", 3, 1) and sender.stamp == 8 * S
        shipper.ring.append((3, 2, b"frame-two"))
        shipper.committed = 2
        sender.push()
        assert await parse(transport.take()) == ([(3, 2, b"frame-two")], 2, 8 * S)
        # The commit point alone carries it too (COMMIT_LINGER passed).
        shipper.committed = 3
        sender._last_sent -= 1
        assert sender.send_commit() is None
        raw = transport.take()
        assert len(raw) == MESSAGE.size and await parse(raw) == ([], 3, 8 * S)
        # Past its renew deadline the primary renews nobody's freshness.
        shipper.vouching = False
        shipper.ring.append((3, 3, b"frame-three"))
        sender.push()
        assert await parse(transport.take()) == ([(3, 3, b"frame-three")], 3, 0)
    finally:
        sender.connection_lost(None)


# -- the read gate, through the app ----------------------------------------------------------


async def call(
    app: Any, method: str, path: str, query: str = "", body: bytes = b""
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request as uvicorn makes it; a live read's client never hangs up."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(b"host", b"test"), (b"content-type", b"text/plain")],
        "client": ("127.0.0.1", 1234),
    }
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # a client that stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 10)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


async def recovered(settings: Settings) -> StreamServerApp:
    app = StreamServerApp(settings)
    app.recovery.start()
    async with asyncio.timeout(30):
        assert await app.recovery.recovered(), "recovery did not finish"
    return app


@pytest.fixture
async def replica(tmp_path: Path):
    """A replica set's member whose role loop never runs: a standby that never heard
    from a primary, until the test says otherwise."""
    app = await recovered(
        Settings(
            data_dir=tmp_path / "data",
            replication_lease="default/gate",
            replica_name="r1",
            replica_url="http://127.0.0.1:1",
            kube_api="http://127.0.0.1:1",
        )
    )
    assert app.replication is not None
    try:
        yield app
    finally:
        await app.replication.roles.client.close()
        await app.recovery.stop()


async def test_a_replica_that_cannot_show_it_is_current_refuses_every_read_with_503(replica):
    app = replica
    r = app.replication
    r.roles.state.primary_url = "http://10.0.0.9:4437"
    for method in ("GET", "HEAD"):
        status, headers, body = await call(app, method, "/v1/stream/s", "offset=-1")
        assert status == 503
        assert headers[b"retry-after"] == b"1"
        assert headers[b"stream-primary"] == b"http://10.0.0.9:4437"
        if method == "GET":
            assert headers[b"content-type"] == b"application/json"
            error = json.loads(body)["error"]
            assert error["code"] == "STALE_REPLICA"
            assert "not yet heard from a primary" in error["message"]
    # Current as of now: the gate lets reads through (no such stream: 404).
    r.freshness.heard(r.freshness.stamp(), commit=0, visible=0)
    assert (await call(app, "GET", "/v1/stream/s", "offset=-1"))[0] == 404
    assert r.status()["fresh_for"] > 4 and r.status()["read_staleness"] == 5.0
    # Seven seconds later by its clock: stale, and it says so.
    real = r.freshness.clock
    r.freshness.clock = lambda: real() + 7 * S
    status, _, body = await call(app, "GET", "/v1/stream/s", "offset=-1")
    assert status == 503
    message = json.loads(body)["error"]["message"]
    assert message.startswith("this replica last heard from its primary 7.0 s ago")
    assert "past the 5 s staleness bound" in message
    assert r.status()["fresh_for"] == 0


async def test_a_primary_answers_reads_only_while_it_may_acknowledge(replica):
    app = replica
    r = app.replication
    now = [1000.0]
    r.roles.clock = lambda: now[0]
    r.roles.state.role = "primary"
    r.roles.state.primary_url = r.settings.replica_url
    r.roles._renewed_at = now[0]
    r.role_switch.primary = True
    assert (await call(app, "GET", "/v1/stream/s", "offset=-1"))[0] == 404
    now[0] += r.settings.lease_renew_deadline  # no renewal since: it may have been replaced
    status, headers, body = await call(app, "GET", "/v1/stream/s", "offset=-1")
    assert status == 503 and b"stream-primary" not in headers  # no other primary known
    assert "could not renew its Lease" in json.loads(body)["error"]["message"]


class Gate:
    """A read gate current until a moment of the test's choosing."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def fresh_for(self) -> float:
        return max(0.0, self.until - time.monotonic())

    def read_refusal(self) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        if self.fresh_for() > 0:
            return None
        return 503, [(b"retry-after", b"1")], b"stale\n"

    def stale(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        loop.call_later(self.fresh_for(), lambda: future.done() or future.set_result(None))
        return future


@pytest.fixture
async def node(tmp_path: Path):
    app = await recovered(Settings(data_dir=tmp_path / "data", long_poll_timeout=60.0))
    try:
        assert (await call(app, "PUT", "/v1/stream/s"))[0] == 201
        assert (await call(app, "POST", "/v1/stream/s", body=b"one;"))[0] == 204
        yield app
    finally:
        await app.recovery.stop()


async def test_a_long_poll_waiting_on_a_replica_that_falls_behind_ends_with_503(node):
    app = node
    _, headers, _ = await call(app, "HEAD", "/v1/stream/s")
    tail = headers[b"stream-next-offset"].decode()
    app.streams.context.read_gate = Gate(0.3)
    # Its timeout is a minute; it is answered once the replica falls behind, and
    # never with a 204 saying up to date.
    status, headers, _ = await call(app, "GET", "/v1/stream/s", f"offset={tail}&live=long-poll")
    assert status == 503 and b"stream-up-to-date" not in headers


async def test_an_sse_response_on_a_replica_that_falls_behind_ends_without_saying_up_to_date(
    node,
):
    app = node
    gate = Gate(0.3)
    app.streams.context.read_gate = gate
    status, headers, body = await call(app, "GET", "/v1/stream/s", "offset=-1&live=sse")
    assert status == 200 and headers[b"content-type"] == b"text/event-stream"
    # The first read, while current: the data and one control event saying up to date.
    assert body.count(b"event: control") == 1 and b'"upToDate":true' in body
    assert gate.fresh_for() == 0  # it ended once the replica fell behind, long before 60 s
