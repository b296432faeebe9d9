"""A standby's stream (``replication/primary/sender.py``), spoken byte by byte against a real
primary: the upgrade and its refusals, frames pushed as they become durable, a
write acknowledged only once the stream acknowledged its frame, the commit point
sent alone when no frame carries it, the standby's clock stamps echoed back;
and a standby whose primary speaks another stream version (here a proxy that
answers 426 as such a primary does) says so and keeps asking."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from testkit.replica_set_processes import STEADY, primary_with_standbys, status, until
from testkit.stream_reads import read_all
from testkit.worker_counts import WORKER_COUNTS

pytestmark = pytest.mark.processes

TEXT = {"content-type": "text/plain"}
# Frame term, lsn (0: none), commit point, echo (the newest stamp received), frame length.
MESSAGE = struct.Struct("<QQQQI")
ACK = struct.Struct("<QQQQ")  # durable term, lsn, commit point known, the standby's stamp
UPGRADE = "pyds-replication/2"


class Peer:
    """A raw connection to a server, speaking as a standby would."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
        self.buf = b""
        self.echo = 0  # the last message's echo

    def request(self, target: str, *headers: str) -> tuple[int, dict[str, str], bytes]:
        """Send a GET; read its head, and its body when it has one."""
        head = [f"GET {target} HTTP/1.1", "host: test", *headers]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode().split("\r\n")
        status = int(lines[0].split()[1])
        fields = dict(line.split(": ", 1) for line in lines[1:])
        fields = {k.lower(): v for k, v in fields.items()}
        length = int(fields.get("content-length", "0"))
        while len(self.buf) < length:
            self.buf += self._recv()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, fields, body

    def message(self) -> tuple[int, int, int, bytes]:
        """The next message the primary pushes: (term, lsn, commit, frame); its echo
        is kept in ``echo``."""
        while len(self.buf) < MESSAGE.size:
            self.buf += self._recv()
        term, lsn, commit, self.echo, n = MESSAGE.unpack_from(self.buf)
        while len(self.buf) < MESSAGE.size + n:
            self.buf += self._recv()
        frame = self.buf[MESSAGE.size : MESSAGE.size + n]
        self.buf = self.buf[MESSAGE.size + n :]
        return term, lsn, commit, frame

    def ack(self, term: int, lsn: int, commit: int, stamp: int = 0) -> None:
        self.sock.sendall(ACK.pack(term, lsn, commit, stamp))

    def closed(self) -> bool:
        """Whether the server ended the connection (nothing more, then EOF)."""
        return not self.buf and self._recv(allow_eof=True) == b""

    def _recv(self, allow_eof: bool = False) -> bytes:
        data = self.sock.recv(65536)
        if not data and not allow_eof:
            raise AssertionError("the server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def query(term: int, set_id: str, after_lsn: int = 0, name: str = "probe") -> str:
    return (
        f"/replication/stream?name={name}&term={term}&after_term=0&after_lsn={after_lsn}"
        f"&committed=0&set={set_id}"
    )


UPGRADING = ("connection: upgrade", f"upgrade: {UPGRADE}")
OFFERED = UPGRADE


# A single process, and a writer behind two workers: a worker splices the stream's
# connection to the writer's (``workers/tunnel.py``).
@WORKER_COUNTS
def test_the_stream_pushes_frames_and_a_write_waits_for_its_acknowledgement(
    start_set, workers: str
) -> None:
    # One server in a set of one: it acknowledges alone until this probe, once
    # caught up, joins the in-sync set; from then on every write waits for the probe.
    (srv,) = start_set(f"stream-push-{workers}", "--workers", workers, count=1)
    primary = primary_with_standbys([srv], 0)
    assert httpx.put(f"{primary.base}s", headers=TEXT).status_code == 201
    acked = httpx.post(f"{primary.base}s", content=b"one;", headers=TEXT)
    assert acked.status_code == 204
    term, set_id = status(primary)["term"], status(primary)["set_id"]
    assert acked.headers["replication-term"] == str(term)  # the term that acknowledged it
    peer = Peer(primary.url)
    try:
        code, fields, _ = peer.request(query(term, set_id), *UPGRADING)
        assert code == 101
        assert fields["upgrade"] == UPGRADE and fields["replication-term"] == str(term)
        # Everything it holds comes at once, in order, from lsn 1.
        lsn = 0
        while lsn < status(primary)["durable"]["lsn"]:
            t, got, _, frame = peer.message()
            if not got:  # the commit point alone (a heartbeat)
                continue
            assert (t, got) == (term, lsn + 1) and frame
            lsn = got
        peer.ack(term, lsn, lsn)
        # As a standby does, it acknowledges every message (a heartbeat comes at least
        # every second) until it is in: the primary may write a frame after the read
        # above, or lose the in-sync change's compare-and-swap to its own renewal, and
        # it tries again only on a later acknowledgement.
        deadline = time.monotonic() + 60
        while status(primary)["in_sync"] != ["probe"]:
            assert time.monotonic() < deadline, "the probe never joined the in-sync set"
            t, got, commit, frame = peer.message()
            if got:  # a frame of this term; a heartbeat (the set idle) is (0, 0)
                assert (t, got) == (term, lsn + 1) and frame
                lsn = got
            else:
                assert (t, frame) == (0, b"")
            peer.ack(term, lsn, commit)
        assert status(primary)["followers"]["probe"] == {"term": term, "lsn": lsn}

        answer: list[httpx.Response] = []
        writer = threading.Thread(
            target=lambda: answer.append(
                httpx.post(f"{primary.base}s", content=b"two;", headers=TEXT, timeout=30)
            )
        )
        writer.start()
        t, got, _, frame = peer.message()
        while not got:
            t, got, _, frame = peer.message()
        assert got == lsn + 1 and b"two;" in frame
        writer.join(0.5)
        assert writer.is_alive() and not answer, "acknowledged before the standby held it"
        peer.ack(term, got, lsn)
        writer.join(30)
        assert answer[0].status_code == 204
        # The moved commit point comes alone, no frame being there to carry it.
        t, none, commit, frame = peer.message()
        assert (none, commit, frame) == (0, got, b"")
    finally:
        peer.close()
    assert read_all(f"{primary.base}s") == b"one;two;"


def test_the_primary_echoes_the_newest_stamp(start_set) -> None:
    """Every message echoes the newest stamp the standby sent on its stream (0 before
    any): the heartbeat after an acknowledgement carries its stamp."""
    (srv,) = start_set("stream-echo", count=1)
    primary = primary_with_standbys([srv], 0)
    assert httpx.put(f"{primary.base}s", headers=TEXT).status_code == 201
    term, set_id = status(primary)["term"], status(primary)["set_id"]
    lsn = status(primary)["durable"]["lsn"]
    peer = Peer(primary.url)
    try:
        code, fields, _ = peer.request(query(term, set_id), *UPGRADING)
        assert code == 101 and fields["upgrade"] == UPGRADE
        peer.message()
        assert peer.echo == 0  # nothing to echo yet
        for stamp in (111, 222):
            peer.ack(term, lsn, lsn, stamp)
            # Messages already on their way echo the older stamp; a heartbeat comes
            # at least once a second and echoes this one.
            until(
                f"stamp {stamp} echoed", lambda stamp=stamp: peer.message() and peer.echo == stamp
            )
    finally:
        peer.close()


@WORKER_COUNTS
def test_a_stream_request_is_refused_with_its_reason(start_set, workers: str) -> None:
    (srv,) = start_set(f"stream-refused-{workers}", "--workers", workers, count=1)
    primary = primary_with_standbys([srv], 0)
    assert httpx.put(f"{primary.base}s", headers=TEXT).status_code == 201
    term, set_id = status(primary)["term"], status(primary)["set_id"]
    other = "0123456789abcdef0123456789abcdef"

    def error(b: bytes) -> str:
        return json.loads(b)["error"]

    def offered(fields: dict[str, str], body: bytes) -> bool:
        return fields["upgrade"] == OFFERED

    cases = [
        # No upgrade asked, an unknown one (the version before the echo, or one after
        # ours), or asked without "connection: upgrade": 426, naming the one offered.
        ((), term, set_id, 426, offered),
        ((f"upgrade: {UPGRADE}",), term, set_id, 426, offered),
        *(
            (("connection: upgrade", f"upgrade: {other}"), term, set_id, 426, offered)
            for other in ("pyds-replication/1", "pyds-replication/3")
        ),
        # Another term: 409, and the connection ends (it cannot carry on).
        (UPGRADING, term + 5, set_id, 409, lambda f, b: error(b) == "wrong term"),
        # Another set's replica (docs/replication.md, "A set's identity").
        (UPGRADING, term, other, 409, lambda f, b: json.loads(b)["set"] == set_id),
        # No set id (a version before them) at (0, 0) while the primary has a history.
        (UPGRADING, term, "", 409, lambda f, b: error(b) == "too far behind: re-copy"),
    ]
    for headers, asked_term, asked_set, code, check in cases:
        peer = Peer(primary.url)
        try:
            got, fields, body = peer.request(query(asked_term, asked_set), *headers)
            assert got == code and check(fields, body), (headers, got, fields, body)
            if headers == UPGRADING:
                assert peer.closed()
        finally:
            peer.close()
    # The upgrade asked of any other path: answered as usual, then the connection ends.
    peer = Peer(primary.url)
    try:
        got, _, _ = peer.request("/healthz", *UPGRADING)
        assert got == 200 and peer.closed()
    finally:
        peer.close()


# What a primary of another stream version answers a stream request of ours: 426 naming
# the versions it speaks (as ``stream_endpoint`` answers one of another version).
OTHER_VERSION = (
    b"HTTP/1.1 426 Upgrade Required\r\nupgrade: pyds-replication/3\r\n"
    b"content-type: text/plain; charset=utf-8\r\ncontent-length: 17\r\n\r\nupgrade required\n"
)


class NoStreams:
    """A TCP proxy to a primary that answers ``/replication/stream`` as a primary of
    another stream version does, and passes every other connection through."""

    def __init__(self, target: str, answer: bytes = OTHER_VERSION) -> None:
        parts = urlsplit(target)
        self.answer = answer
        self.target = (parts.hostname, parts.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.first_lines: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        first = client.recv(65536)
        self.first_lines.append(first.split(b"\r\n", 1)[0])
        if first.startswith(b"GET /replication/stream"):
            client.sendall(self.answer)
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target)
            upstream.sendall(first)
        except OSError:  # the primary stopped (the test's end)
            client.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            s.close()


def member(srv, name: str, url: str, api_url: str, lease: str) -> None:
    srv.args += [
        "--replication-lease", lease, "--replica-name", name,
        "--replica-url", url, "--kube-api", api_url, "--replication-set-size", "2",
        *STEADY,
    ]  # fmt: skip


def test_a_standby_says_when_its_primary_speaks_another_stream_version(server_factory, api) -> None:
    """A 426 means the primary was updated before its standbys (docs/compatibility.md):
    the standby says so in its status and keeps asking; there is no other way to
    follow."""
    # The primary announces the proxy as its URL: its standby reaches it only
    # through the proxy, which answers streams as another version would.
    first = server_factory()
    proxy = NoStreams(first.url)
    try:
        lease = "default/stream-other-version"
        member(first, "r0", proxy.url, api.url, lease)
        first.start()
        until("r0 primary", lambda: status(first)["role"] == "primary")
        second = server_factory()
        member(second, "r1", second.url, api.url, lease)
        second.start()
        until(
            "r1 says why",
            lambda: "update the standbys first" in str(status(second)["problem"]),
        )
        assert "pyds-replication/3" in status(second)["problem"]

        def streams_asked() -> int:
            return sum(line.startswith(b"GET /replication/stream") for line in proxy.first_lines)

        asked = streams_asked()
        until("r1 asks again", lambda: streams_asked() > asked)
        assert not any(b"/replication/fetch" in line for line in proxy.first_lines)
        assert status(first)["in_sync"] == [] and status(second)["fresh_for"] == 0
    finally:
        proxy.close()
