"""The load: raw HTTP/1.1 keep-alive connections, an epoll fill, and wrk.

Python's HTTP clients cost more per response than the servers measured
here, so where wrk cannot do the job (chained catch-up reads, long-poll wake
latency, idle readers, fills) the harness speaks HTTP over raw sockets.
"""

from __future__ import annotations

import collections
import json
import re
import select
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench import log
from bench.servers import Server
from testkit.servers import die_with_parent

HERE = Path(__file__).resolve().parent
BIN = {"Content-Type": "application/octet-stream"}
JSON_CT = {"Content-Type": "application/json"}


def request_bytes(
    method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: bench"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT"):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Conn:
    """One keep-alive connection on a blocking socket, reading into a reused buffer.

    It parses a status line and headers and otherwise only counts body bytes
    (or keeps them when asked).
    """

    def __init__(self, port: int, timeout: float = 120):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scratch = bytearray(1 << 20)
        self.view = memoryview(self.scratch)
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, path: str, headers=None, body: bytes = b"") -> None:
        self.sock.sendall(request_bytes(method, path, headers, body))

    def request(self, method: str, path: str, headers=None, body: bytes = b"", keep=True):
        self.send(method, path, headers, body)
        return self.read_response(keep=keep, head=method == "HEAD")

    def _more(self) -> None:
        n = self.sock.recv_into(self.scratch)
        if n == 0:
            raise ConnectionError("server closed the connection")
        self.buf += self.view[:n]

    def _line(self) -> bytes:
        while (i := self.buf.find(b"\r\n")) < 0:
            self._more()
        line = bytes(self.buf[:i])
        del self.buf[: i + 2]
        return line

    def _body(self, length: int, keep: bool, out: list[bytes]) -> int:
        """Consume ``length`` body bytes: from the buffer, then straight off the socket."""
        take = min(length, len(self.buf))
        if keep:
            out.append(bytes(self.buf[:take]))
        del self.buf[:take]
        left = length - take
        while left:
            n = self.sock.recv_into(self.view, min(left, len(self.scratch)))
            if n == 0:
                raise ConnectionError("server closed the connection mid-body")
            if keep:
                out.append(bytes(self.view[:n]))
            left -= n
        return length

    def read_response(self, keep: bool = True, head: bool = False):
        """(status, headers with lower-case names, body bytes or byte count)."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        out: list[bytes] = []
        size = 0
        if head or status in (204, 304) or 100 <= status < 200:
            pass
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                chunk = int(self._line().split(b";")[0], 16)
                if chunk == 0:
                    while self._line():  # trailers, then the empty line
                        pass
                    break
                size += self._body(chunk, keep, out)
                self._line()
        else:
            size = self._body(int(headers.get("content-length", "0")), keep, out)
        return status, headers, (b"".join(out) if keep else size)


def create_streams(srv: Server, names: list[str], headers=BIN) -> None:
    """PUT each stream, then wait until a HEAD finds every one of them.

    The reference answers 201 to a PUT before the new stream is visible to
    the next request (its metadata write is asynchronous): under load an
    append right after the create gets 404. Waiting here keeps that race
    out of the measurements.
    """
    c = Conn(srv.port)
    try:
        for name in names:
            status, _, body = c.request("PUT", f"/v1/stream/{name}", headers)
            if status not in (200, 201):
                raise RuntimeError(f"PUT {name}: {status} {body[:200]!r}")
        for name in names:
            deadline = time.monotonic() + 30
            while c.request("HEAD", f"/v1/stream/{name}")[0] != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} created but not visible after 30 s")
                time.sleep(0.01)
    finally:
        c.close()


def tails(srv: Server, names: list[str]) -> list[int] | None:
    """The byte part of each stream's Stream-Next-Offset ("<seq>_<byte>"), or None."""
    c = Conn(srv.port)
    try:
        out = []
        for name in names:
            _, headers, _ = c.request("HEAD", f"/v1/stream/{name}")
            out.append(int(headers.get("stream-next-offset", "").rpartition("_")[2]))
        return out
    except ValueError:
        return None
    finally:
        c.close()


@dataclass(frozen=True)
class Read:
    seconds: float
    bytes: int
    requests: int


def read_stream(srv: Server, path: str) -> Read:
    """Follow Stream-Next-Offset from -1 until Stream-Up-To-Date, counting body bytes."""
    c = Conn(srv.port)
    try:
        offset, total, requests = "-1", 0, 0
        started = time.perf_counter()
        while True:
            status, headers, size = c.request("GET", f"{path}?offset={offset}", keep=False)
            if status != 200:
                raise RuntimeError(f"catch-up GET: {status}")
            total += size
            requests += 1
            offset = headers["stream-next-offset"]
            if headers.get("stream-up-to-date") == "true":
                break
        return Read(time.perf_counter() - started, total, requests)
    finally:
        c.close()


# ------------------------------------------------------------------- wrk


@dataclass(frozen=True)
class WrkStats:
    """What append.lua's done() prints: wrk's own counts and latencies."""

    requests: int
    status_errors: int
    socket_errors: int
    seconds: float
    p50_us: int
    p90_us: int
    p99_us: int
    max_us: int
    mean_us: float

    @property
    def ok(self) -> int:
        return self.requests - self.status_errors

    @property
    def rate(self) -> float:
        return self.ok / self.seconds

    @property
    def errors(self) -> int:
        return self.status_errors + self.socket_errors


def wrk(
    srv: Server,
    *,
    threads: int,
    connections: int,
    seconds: float,
    prefix: str,
    streams: int,
    size: int = 100,
) -> WrkStats:
    """POST ``size``-byte appends with wrk and append.lua for ``seconds``."""
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "30s",
        "--latency",
        "-s",
        str(HERE / "append.lua"),
        f"http://127.0.0.1:{srv.port}",
        "--",
        prefix,
        str(streams),
        str(size),
        str(threads),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 90, preexec_fn=die_with_parent
    )
    m = re.search(r"^BENCH (\{.*\})$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout[-1500:]} {proc.stderr}")
    return WrkStats(**json.loads(m.group(1)))


# ------------------------------------------------------------------ fills


@dataclass(frozen=True)
class Fill:
    ok: int  # 2xx answers
    bad: dict[int, int]  # other answers, by status
    again: list[bytes]  # the requests answered 404 (to retry)
    seconds: float


def fill(
    srv: Server,
    requests: Iterable[bytes],
    connections: int,
    timeout: float = 3600,
    timings: list[tuple[float, float]] | None = None,
) -> Fill:
    """Send every request in ``requests`` over ``connections`` keep-alive sockets.

    One epoll loop, one request in flight per connection, responses parsed
    just enough to find their end. For setting up data, not for measuring:
    wrk is lighter, but it lost count of the reference's answers to large
    PUTs here, and a fill must know exactly what was acknowledged. With
    ``timings``, each 2xx answer adds (perf_counter when sent, seconds until
    answered) to it: the latency of every acknowledged request.
    """
    todo = iter(requests)
    ep = select.epoll()
    socks: dict[int, socket.socket] = {}
    bufs: dict[int, bytearray] = {}
    sent: dict[int, bytes] = {}
    sent_at: dict[int, float] = {}
    ok, bad, again = 0, collections.Counter(), []
    started = time.monotonic()

    def send_next(fd: int) -> bool:
        req = next(todo, None)
        if req is None:
            return False
        sent_at[fd] = time.perf_counter()
        socks[fd].sendall(req)
        sent[fd] = req
        return True

    try:
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fd = sock.fileno()
            socks[fd], bufs[fd] = sock, bytearray()
            if not send_next(fd):
                sock.close()
                del socks[fd]
                break
            ep.register(fd, select.EPOLLIN)
        while socks:
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"fill not done after {timeout} s")
            for fd, _ in ep.poll(1.0):
                data = socks[fd].recv(1 << 16)
                if not data:
                    raise RuntimeError(f"{srv.kind} closed a connection during the fill")
                buf = bufs[fd]
                buf += data
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                head = bytes(buf[:end]).lower()
                m = re.search(rb"\r\ncontent-length: *(\d+)", head)
                if m:
                    if len(buf) < end + 4 + int(m.group(1)):
                        continue
                elif b"chunked" in head and not buf.endswith(b"0\r\n\r\n"):
                    continue
                status = int(head[9:12])
                if 200 <= status < 300:
                    ok += 1
                    if timings is not None:
                        timings.append((sent_at[fd], time.perf_counter() - sent_at[fd]))
                elif status == 404:
                    again.append(sent[fd])
                else:
                    bad[status] += 1
                buf.clear()
                if not send_next(fd):
                    ep.unregister(fd)
                    socks.pop(fd).close()
            if not srv.running:
                raise RuntimeError(f"{srv.kind} died during the fill:\n{srv.log_tail()}")
    finally:
        ep.close()
        for sock in socks.values():
            sock.close()
    return Fill(ok, dict(bad), again, time.monotonic() - started)


def fill_all(
    srv: Server,
    requests: Iterable[bytes],
    connections: int,
    retries: int = 20,
    timings: list[tuple[float, float]] | None = None,
) -> tuple[int, float]:
    """fill(), then again, on fewer connections, for the appends answered 404.

    The reference answers 404 ("Stream not found") to some appends when many
    streams are written at once: to a POST right after the PUT that created
    the stream (its metadata write is asynchronous), and when its pool of 100
    open files evicts a file between the write and the fdatasync (the error
    text contains "not found", which it maps to 404). Such an append was not
    acknowledged, so sending it again is safe. Any other failure is an error.
    Returns (requests acknowledged, seconds); ``timings`` as for fill().
    """
    started = time.monotonic()
    total = 0
    for _ in range(retries + 1):
        done = fill(srv, requests, connections, timings=timings)
        total += done.ok
        if done.bad:
            raise RuntimeError(f"{srv.kind}: fill answered {done.bad} (status: count)")
        if not done.again:
            return total, time.monotonic() - started
        log(f"{srv.kind}: {len(done.again)} appends answered 404, sending them again")
        time.sleep(0.5)
        requests, connections = done.again, max(1, connections // 4)
    raise RuntimeError(f"{srv.kind}: {len(done.again)} appends still answered 404")
