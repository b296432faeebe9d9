"""Side-by-side benchmark: our server, the Node reference server, the HTTP ceiling.

    python e2e/bench/run.py                      # full profile (5 to 10 minutes)
    python e2e/bench/run.py --quick              # smoke profile (about 40 s)
    python e2e/bench/run.py --only live,idle --servers ours,reference
    python e2e/bench/run.py --quick --json out.json
    python e2e/bench/run.py --baseline HEAD~3     # ours now against ours at a git ref

With ``--baseline REF`` the comparison column is this server as of REF (checked
out into a temporary git worktree and run from there) instead of the reference:
the before/after of a change in one run, on the same machine and disk.

Everything runs on this machine in one go. Each workload starts a fresh
server in its own temporary data directory on a free port (ours, then the
reference), waits until it is ready, prepares its streams, measures, and
stops it. Both servers run with the same long-poll timeout (20 s) and keep
their durability: they fdatasync before acknowledging, nothing here turns
that off. Load comes from wrk (appends, with the Lua scripts next to this
file) and, where wrk cannot do the job (chained catch-up reads, long-poll
wake latency, 1,000 idle readers, restart), from raw blocking or epoll
sockets in this process: the leanest client Python has.

The ceiling is ceiling_app.py, a Starlette app answering POST with 204 under
our uvicorn settings, driven exactly like the 64 x 64 append workload.

The table gives each workload, ours, the reference, ours/reference, the
target from the performance issue and whether ours meets it. Servers that
cannot run here are skipped with a message: ours when `import stream_server`
fails, the reference when Node.js or npm is missing, the ceiling when
Starlette or uvicorn is missing. The harness installs what it needs itself:
wrk with apt-get (as root, when missing) and the reference server with
`npm install` into e2e/bench/node_modules (gitignored).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LONG_POLL_SECONDS = 20
REFERENCE_PACKAGE = "@durable-streams/server"
MiB = 2**20
SERVERS = ("ours", "reference", "ceiling")
OURS = ("ours", "baseline")  # our server, now and at --baseline REF


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------ processes


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the harness dies, even by SIGKILL (no orphans)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


@dataclass
class Server:
    """One server process: ours, the reference, or the ceiling app."""

    kind: str
    workdir: Path
    source: Path = ROOT / "server"  # the stream_server package to run (ours, baseline)
    port: int = field(default_factory=free_port)
    data_dir: Path | None = None
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def command(self) -> list[str]:
        assert self.data_dir is not None
        if self.kind in OURS:
            return [
                sys.executable,
                "-m",
                "stream_server",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                "--long-poll-timeout",
                str(LONG_POLL_SECONDS),
            ]
        if self.kind == "reference":
            return [
                "node",
                str(HERE / "reference_server.mjs"),
                str(self.port),
                str(self.data_dir),
                str(LONG_POLL_SECONDS * 1000),
            ]
        return [sys.executable, str(HERE / "ceiling_app.py"), str(self.port)]

    def start(self, data_dir: Path | None = None, timeout: float = 300) -> float:
        """Start the process; return the seconds from spawn to ready.

        Ready means GET /readyz answers 200 for ours; for the reference and the
        ceiling, which have no readiness endpoint, that any HTTP answer comes.
        """
        if data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix=f"{self.kind}-", dir=self.workdir))
        self.data_dir = data_dir
        self.log_path = self.workdir / f"{self.kind}-{self.port}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.source), env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("DS_LOG_LEVEL", "warning")
        with open(self.log_path, "ab") as logf:
            started = time.monotonic()
            self.proc = subprocess.Popen(
                self.command(),
                cwd=HERE,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_die_with_parent,
            )
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited at start:\n{self.log_tail()}")
            status = probe(self.port, "/readyz")
            if status == 200 or (status and self.kind not in OURS):
                return time.monotonic() - started
            time.sleep(0.01)
        raise RuntimeError(f"{self.kind} not ready after {timeout} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except (OSError, AttributeError):
            return ""

    def rss(self) -> int:
        return rss_bytes(self.proc.pid) if self.proc else 0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# ---------------------------------------------------- raw HTTP/1.1 client


def probe(port: int, path: str) -> int | None:
    """The status of GET path, or None when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
            line = s.recv(64)
            return int(line.split(b" ", 2)[1]) if line.startswith(b"HTTP/") else None
    except (OSError, ValueError, IndexError):
        return None


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

    Python's HTTP clients cost more per response than the servers measured
    here; this one parses a status line and headers and otherwise only
    counts body bytes (or keeps them when asked).
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


BIN = {"Content-Type": "application/octet-stream"}
JSON_CT = {"Content-Type": "application/json"}


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


# ------------------------------------------------------------------- wrk


def wrk(
    srv: Server,
    *,
    threads: int,
    connections: int,
    seconds: float,
    prefix: str,
    streams: int,
    size: int = 100,
) -> dict:
    """POST ``size``-byte appends with wrk and append.lua; wrk's own counts and latencies."""
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
        cmd, capture_output=True, text=True, timeout=seconds + 90, preexec_fn=_die_with_parent
    )
    m = re.search(r"^BENCH (\{.*\})$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout[-1500:]} {proc.stderr}")
    st = json.loads(m.group(1))
    st["ok"] = st["requests"] - st["status_errors"]
    st["rate"] = st["ok"] / st["seconds"]
    return st


def fill(
    srv: Server, requests, connections: int, timeout: float = 3600
) -> tuple[int, dict[int, int], list[bytes], float]:
    """Send every request in ``requests`` (bytes) over ``connections`` keep-alive sockets.

    One epoll loop, one request in flight per connection, responses parsed
    just enough to find their end. For setting up data, not for measuring:
    wrk is lighter, but it lost count of the reference's answers to large
    PUTs here, and a fill must know exactly what was acknowledged.
    Returns (2xx answers, other answers by status, the requests answered
    404 (to retry), seconds).
    """
    todo = iter(requests)
    ep = select.epoll()
    socks: dict[int, socket.socket] = {}
    bufs: dict[int, bytearray] = {}
    sent: dict[int, bytes] = {}
    ok, bad, again = 0, collections.Counter(), []
    started = time.monotonic()

    def send_next(fd: int) -> bool:
        req = next(todo, None)
        if req is None:
            return False
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
                elif status == 404:
                    again.append(sent[fd])
                else:
                    bad[status] += 1
                buf.clear()
                if not send_next(fd):
                    ep.unregister(fd)
                    socks.pop(fd).close()
            if srv.proc.poll() is not None:
                raise RuntimeError(f"{srv.kind} died during the fill:\n{srv.log_tail()}")
    finally:
        ep.close()
        for sock in socks.values():
            sock.close()
    return ok, dict(bad), again, time.monotonic() - started


def fill_all(srv: Server, requests, connections: int, retries: int = 20) -> tuple[int, float]:
    """fill(), then again, on fewer connections, for the appends answered 404.

    The reference answers 404 ("Stream not found") to some appends when many
    streams are written at once: to a POST right after the PUT that created
    the stream (its metadata write is asynchronous), and when its pool of 100
    open files evicts a file between the write and the fdatasync (the error
    text contains "not found", which it maps to 404). Such an append was not
    acknowledged, so sending it again is safe. Any other failure is an error.
    Returns (requests acknowledged, seconds).
    """
    started = time.monotonic()
    total = 0
    for _ in range(retries + 1):
        ok, bad, again, _ = fill(srv, requests, connections)
        total += ok
        if bad:
            raise RuntimeError(f"{srv.kind}: fill answered {bad} (status: count)")
        if not again:
            return total, time.monotonic() - started
        log(f"{srv.kind}: {len(again)} appends answered 404, sending them again")
        time.sleep(0.5)
        requests, connections = again, max(1, connections // 4)
    raise RuntimeError(f"{srv.kind}: {len(again)} appends still answered 404")


# ------------------------------------------------------------- workloads


@dataclass
class Profile:
    quick: bool
    duration: float
    warmup: float
    catchup_mib: int
    catchup_append: int  # bytes per binary append when filling the catch-up stream
    live_rounds: int
    idle_readers: int
    idle_streams: int
    restart_streams: int
    restart_mib: int

    @classmethod
    def make(cls, quick: bool, duration: float | None) -> Profile:
        if quick:
            return cls(True, duration or 2, 0, 4, 16 * 1024, 40, 200, 20, 2000, 20)
        return cls(False, duration or 10, 2, 100, 1024, 500, 1000, 100, 100_000, 1024)


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


def appends(srv: Server, prof: Profile, *, streams: int, threads: int) -> dict:
    """64 connections POST 100-byte appends over ``streams`` streams for the duration.

    Afterwards the streams' tails say how many appends the server holds; it
    must hold at least as many as wrk saw acknowledged (it may hold a few
    more: those in flight when wrk stopped).
    """
    prefix = f"a{streams}-"
    names = [f"{prefix}{i}" for i in range(streams)]
    create_streams(srv, names)
    c = Conn(srv.port)
    try:  # what one 100-byte append adds to an offset, on this server
        first = tails(srv, names[:1])
        c.request("POST", f"/v1/stream/{names[0]}", BIN, b"x" * 100)
    finally:
        c.close()
    before = tails(srv, names)
    step = before[0] - first[0] if before and first else 0
    kw = dict(threads=threads, connections=64, prefix=prefix, streams=streams)
    acked = 0
    if prof.warmup:
        acked += wrk(srv, seconds=prof.warmup, **kw)["ok"]
    st = wrk(srv, seconds=prof.duration, **kw)
    acked += st["ok"]
    after = tails(srv, names)
    held = None
    if step > 0 and before and after:
        held = sum(a - b for a, b in zip(after, before, strict=True)) // step
        if held < acked:
            raise RuntimeError(f"{srv.kind} holds {held} appends, {acked} were acknowledged")
    return {
        "appends_per_s": st["rate"],
        "p50_ms": st["p50_us"] / 1000,
        "p99_ms": st["p99_us"] / 1000,
        "errors": st["status_errors"] + st["socket_errors"],
        "acknowledged": acked,
        "held": held,
    }


def ceiling_appends(srv: Server, prof: Profile) -> dict:
    """The 64 x 64 append workload, verbatim, against the ceiling app (no PUTs needed)."""
    kw = dict(threads=64, connections=64, prefix="a64-", streams=64)
    if prof.warmup:
        wrk(srv, seconds=prof.warmup, **kw)
    st = wrk(srv, seconds=prof.duration, **kw)
    return {
        "appends_per_s": st["rate"],
        "p50_ms": st["p50_us"] / 1000,
        "p99_ms": st["p99_us"] / 1000,
        "errors": st["status_errors"] + st["socket_errors"],
    }


def sequential(srv: Server, prof: Profile) -> dict:
    """One connection, one request at a time (wrk -t1 -c1): append latency."""
    create_streams(srv, ["seq-0"])
    kw = dict(threads=1, connections=1, prefix="seq-", streams=1)
    if prof.warmup:
        wrk(srv, seconds=prof.warmup, **kw)
    st = wrk(srv, seconds=prof.duration, **kw)
    return {
        "p50_ms": st["p50_us"] / 1000,
        "p99_ms": st["p99_us"] / 1000,
        "appends_per_s": st["rate"],
        "errors": st["status_errors"] + st["socket_errors"],
    }


def catch_up(srv: Server, prof: Profile, *, json_mode: bool) -> dict:
    """Fill one stream with ``catchup_mib`` MiB of 1 KiB messages; time reads from -1."""
    name = "catchup-json" if json_mode else "catchup-bin"
    path = f"/v1/stream/{name}"
    create_streams(srv, [name], JSON_CT if json_mode else BIN)
    started = time.monotonic()
    if json_mode:
        # One POST = one JSON array of 1,024 messages of exactly 1 KiB each.
        msg = b'{"pad":"' + b"j" * (1024 - 10) + b'"}'
        batch = b"[" + b",".join([msg] * 1024) + b"]"
        c = Conn(srv.port)
        try:
            for _ in range(prof.catchup_mib):
                status, _, body = c.request("POST", path, JSON_CT, batch)
                if status not in (200, 204):
                    raise RuntimeError(f"JSON fill POST: {status} {body[:200]!r}")
        finally:
            c.close()
        expected = None
    else:
        total = prof.catchup_mib * MiB
        count = total // prof.catchup_append
        post = request_bytes("POST", path, BIN, b"b" * prof.catchup_append)
        ok, _ = fill_all(srv, (post for _ in range(count)), connections=16)
        if ok != count:
            raise RuntimeError(f"binary fill: {ok} of {count} appends acknowledged")
        expected = total
    fill_seconds = time.monotonic() - started
    passes = []
    for _ in range(2 if prof.quick else 3):
        passes.append(read_all(srv, path))
    for p in passes:
        if expected is not None and p["bytes"] != expected:
            raise RuntimeError(f"catch-up read {p['bytes']} bytes, expected {expected}")
        if p["bytes"] < prof.catchup_mib * MiB:
            raise RuntimeError(f"catch-up read only {p['bytes']} bytes")
    rates = [p["bytes"] / MiB / p["seconds"] for p in passes]
    return {
        "mib_per_s": statistics.median(rates),
        "passes_mib_per_s": [round(r, 1) for r in rates],
        "bytes": passes[0]["bytes"],
        "requests": passes[0]["requests"],
        "fill_seconds": round(fill_seconds, 1),
        "append_bytes": 1024 * 1024 if json_mode else prof.catchup_append,
    }


def read_all(srv: Server, path: str) -> dict:
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
        return {"seconds": time.perf_counter() - started, "bytes": total, "requests": requests}
    finally:
        c.close()


def live(srv: Server, prof: Profile) -> dict:
    """A long-poll reader waits; a writer POSTs 100 bytes: time until the reader has them."""
    create_streams(srv, ["live-0"])
    path = "/v1/stream/live-0"
    reader, writer = Conn(srv.port), Conn(srv.port)
    body = b"y" * 100
    lat: list[float] = []
    try:
        _, headers, _ = reader.request("HEAD", path)
        offset = headers["stream-next-offset"]
        warm = 5
        for i in range(warm + prof.live_rounds):
            reader.send("GET", f"{path}?offset={offset}&live=long-poll")
            time.sleep(0.005)  # the reader is parked on the server before the append
            sent = time.perf_counter()
            writer.send("POST", path, BIN, body)
            status, headers, data = reader.read_response()
            got = time.perf_counter()
            if status != 200 or data != body:
                raise RuntimeError(f"long-poll answered {status} with {len(data)} bytes")
            offset = headers["stream-next-offset"]
            status, _, _ = writer.read_response()
            if status not in (200, 204):
                raise RuntimeError(f"live POST: {status}")
            if i >= warm:
                lat.append((got - sent) * 1000)
    finally:
        reader.close()
        writer.close()
    lat.sort()
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1],
        "rounds": len(lat),
    }


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def idle_readers(srv: Server, prof: Profile) -> dict:
    """N long-poll readers park on S streams; one append per stream; wake latency per reader.

    Raw non-blocking sockets and one epoll: each reader's wake time is when
    epoll reports its socket readable (the responses are read afterwards),
    so the client adds microseconds. Memory per waiter is the server's RSS
    growth while the readers connect and park, divided by their number: the
    connection, the request and the waiter together.
    """
    n, s = prof.idle_readers, prof.idle_streams
    names = [f"idle-{i}" for i in range(s)]
    create_streams(srv, names)
    time.sleep(0.3)
    rss_before = srv.rss()
    socks = []
    for i in range(n):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request_bytes("GET", f"/v1/stream/{names[i % s]}?offset=now&live=long-poll"))
        sock.setblocking(False)
        socks.append(sock)
    time.sleep(1.0 + n / 1000)  # every request read and parked
    rss_idle = srv.rss()
    ep = select.epoll()
    by_fd = {sock.fileno(): i for i, sock in enumerate(socks)}
    for fd in by_fd:
        ep.register(fd, select.EPOLLIN)
    early = ep.poll(0)
    writers = [Conn(srv.port) for _ in names]
    posts = [request_bytes("POST", f"/v1/stream/{name}", BIN, b"z" * 100) for name in names]
    sent: list[float] = [0.0] * s
    wake: dict[int, float] = {}
    status: dict[int, int] = {}
    try:
        for j, w in enumerate(writers):
            sent[j] = time.perf_counter()
            w.sock.sendall(posts[j])
        deadline = time.monotonic() + LONG_POLL_SECONDS + 10
        while len(wake) < n and time.monotonic() < deadline:
            events = ep.poll(1.0)
            now = time.perf_counter()
            for fd, _ in events:  # only the time here; reading waits until all woke
                ep.unregister(fd)
                wake[by_fd[fd]] = now
        for i in wake:
            try:
                head = socks[i].recv(65536)
                status[i] = int(head.split(b" ", 2)[1])
            except (OSError, ValueError, IndexError):
                status[i] = 0
        post_status = [w.read_response()[0] for w in writers]
    finally:
        ep.close()
        for sock in socks:
            sock.close()
        for w in writers:
            w.close()
    woken = [i for i in range(n) if status.get(i) == 200]
    lat = sorted((wake[i] - sent[i % s]) * 1000 for i in woken)
    return {
        "wake_p99_ms": percentile(lat, 99) if lat else float("nan"),
        "wake_p50_ms": percentile(lat, 50) if lat else float("nan"),
        "wake_max_ms": lat[-1] if lat else float("nan"),
        "woken": len(woken),
        "readers": n,
        "streams": s,
        "answered_before_append": len(early),
        "posts_ok": sum(1 for st in post_status if st in (200, 204)),
        "kib_per_waiter": max(0, rss_idle - rss_before) / n / 1024,
        "rss_idle_mib": rss_idle / MiB,
    }


def restart(srv: Server, prof: Profile) -> dict:
    """Create many streams holding ``restart_mib`` MiB in all, stop, start again: time to ready."""
    n = prof.restart_streams
    size = prof.restart_mib * MiB // n
    names = [f"many/{i}" for i in range(n)]
    # The reference answers 404 to appends on many streams at once (see
    # fill_all) and may keep the bytes of such an unacknowledged append in
    # its file; one connection avoids that, so both data directories hold
    # the same clean data. The fill is not measured.
    conns = 1 if srv.kind == "reference" else 32
    started = time.monotonic()
    puts = (request_bytes("PUT", f"/v1/stream/{name}", BIN) for name in names)
    ok, bad, again, _ = fill(srv, puts, connections=conns)
    if ok != n:
        raise RuntimeError(f"restart fill: {ok} of {n} streams created: {bad} {len(again)}x 404")
    body = b"r" * size
    posts = (request_bytes("POST", f"/v1/stream/{name}", BIN, body) for name in names)
    ok, _ = fill_all(srv, posts, connections=conns)
    if ok != n:
        raise RuntimeError(f"restart fill: {ok} of {n} appends acknowledged")
    fill_seconds = time.monotonic() - started
    rss_full = srv.rss()
    srv.stop()
    on_disk = dir_bytes(srv.data_dir)
    seconds = srv.start(srv.data_dir, timeout=600)
    rss_ready = srv.rss()
    c = Conn(srv.port)
    try:
        for i in (0, n // 2, n - 1):
            st, _, _ = c.request("HEAD", f"/v1/stream/many/{i}")
            if st != 200:
                raise RuntimeError(f"after the restart, HEAD many/{i} gave {st}")
    finally:
        c.close()
    return {
        "seconds_to_ready": seconds,
        "rss_mib": rss_ready / MiB,
        "rss_before_restart_mib": rss_full / MiB,
        "streams": n,
        "bytes_per_stream": size,
        "data_mib": n * size / MiB,
        "on_disk_mib": on_disk / MiB,
        "fill_seconds": round(fill_seconds, 1),
    }


# ---------------------------------------------------------------- the table


@dataclass
class Row:
    title: str
    metric: str
    unit: str
    target: str = ""
    # (ours, reference) -> met?; None when it cannot be judged
    check: Callable[[float, float | None], bool | None] | None = None


def at_least(k: float):
    return lambda o, r: None if r is None else o >= k * r


def at_most(k: float):
    return lambda o, r: None if r is None else o <= k * r


@dataclass
class Workload:
    key: str
    run: Callable[[Server, Profile], dict]
    rows: Callable[[Profile], list[Row]]
    servers: tuple[str, ...] = ("ours", "reference")


WORKLOADS = [
    Workload(
        "appends_64x64",
        lambda s, p: appends(s, p, streams=64, threads=64),
        lambda p: [
            Row("64 conns, 64 streams", "appends_per_s", "appends/s", ">= 7x ref", at_least(7))
        ],
    ),
    Workload(
        "appends_64x1",
        lambda s, p: appends(s, p, streams=1, threads=2),
        lambda p: [
            Row("64 conns, 1 stream", "appends_per_s", "appends/s", ">= 15x ref", at_least(15))
        ],
    ),
    Workload(
        "sequential",
        sequential,
        lambda p: [Row("1 client sequential, p50", "p50_ms", "ms", "<= 0.5x ref", at_most(0.5))],
    ),
    Workload(
        "catchup_bin",
        lambda s, p: catch_up(s, p, json_mode=False),
        lambda p: [
            Row(
                f"catch-up {p.catchup_mib} MiB, binary",
                "mib_per_s",
                "MiB/s",
                ">= 6x ref",
                at_least(6),
            )
        ],
    ),
    Workload(
        "catchup_json",
        lambda s, p: catch_up(s, p, json_mode=True),
        lambda p: [
            Row(
                f"catch-up {p.catchup_mib} MiB, JSON",
                "mib_per_s",
                "MiB/s",
                ">= 6x ref",
                at_least(6),
            )
        ],
    ),
    Workload(
        "live",
        live,
        lambda p: [
            Row("live long-poll POST->reader, p50", "p50_ms", "ms", "<= 0.5x ref", at_most(0.5)),
            Row("live long-poll POST->reader, p99", "p99_ms", "ms", "<= 0.5x ref", at_most(0.5)),
        ],
    ),
    Workload(
        "idle",
        idle_readers,
        lambda p: [
            Row(
                f"{p.idle_readers:,} idle long-polls/{p.idle_streams} streams, wake p99",
                "wake_p99_ms",
                "ms",
                "all woken, <= 50 ms",
                None,  # judged in judge(): needs "woken" too
            ),
            Row(
                f"{p.idle_readers:,} idle long-polls, memory per waiter",
                "kib_per_waiter",
                "KiB",
                "reported",
            ),
        ],
    ),
    Workload(
        "restart",
        restart,
        lambda p: [
            Row(
                f"{p.restart_streams:,} streams/{p.restart_mib:,} MiB: restart to ready",
                "seconds_to_ready",
                "s",
                "<= 10 s",
                lambda o, r: o <= 10,
            ),
            Row(f"{p.restart_streams:,} streams: RSS when ready", "rss_mib", "MiB", "reported"),
        ],
    ),
]
KEYS = [w.key for w in WORKLOADS]


def judge(w: Workload, row: Row, ours: dict | None, ref: dict | None) -> bool | None:
    if not ours or row.metric not in ours:
        return None
    if w.key == "idle" and row.metric == "wake_p99_ms":
        return ours["woken"] == ours["readers"] and ours["wake_p99_ms"] <= 50
    if row.check is None:
        return None
    return row.check(ours[row.metric], ref.get(row.metric) if ref else None)


def build_rows(prof: Profile, results: dict, ceiling: dict | None) -> list[dict]:
    rows = []
    for w in WORKLOADS:
        if w.key not in results:
            continue
        res = results[w.key]
        ours, ref = res.get("ours"), res.get("reference")
        for row in w.rows(prof):
            o = ours.get(row.metric) if ours else None
            r = ref.get(row.metric) if ref else None
            rows.append(
                {
                    "workload": w.key,
                    "title": row.title,
                    "unit": row.unit,
                    "ours": o,
                    "reference": r,
                    "ratio": (o / r) if o is not None and r else None,
                    "target": row.target,
                    "met": judge(w, row, ours, ref),
                }
            )
        if w.key == "appends_64x64" and ceiling:
            c = ceiling["appends_per_s"]
            o = ours["appends_per_s"] if ours else None
            r = ref["appends_per_s"] if ref else None
            rows.append(
                {
                    "workload": "appends_64x64_vs_ceiling",
                    "title": "64 conns, 64 streams, share of ceiling",
                    "unit": "%",
                    "ours": 100 * o / c if o is not None else None,
                    "reference": 100 * r / c if r is not None else None,
                    "ratio": None,
                    "target": ">= 60% of ceiling",
                    "met": (o >= 0.6 * c) if o is not None else None,
                }
            )
    return rows


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v != v:  # NaN
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(rows: list[dict], ceiling: dict | None, other: str = "reference") -> str:
    short_name = "base" if other != "reference" else "ref"
    head = ("workload", "unit", "ours", other, f"ours/{short_name}", "target", "met?")
    body = []
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        body.append(
            (r["title"], r["unit"], fmt(r["ours"]), fmt(r["reference"]), ratio, r["target"], met)
        )
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    right = {2, 3, 4}

    def line(cells) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                for i, c in enumerate(cells)
            )
            + " |"
        )

    out = []
    if ceiling:
        out.append(
            f"HTTP ceiling (Starlette POST->204, uvicorn uvloop+httptools, 1 worker, "
            f"64 conns): {ceiling['appends_per_s']:,.0f} req/s"
        )
    out += [
        line(head),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *(line(b) for b in body),
    ]
    return "\n".join(out)


# ----------------------------------------------------------------- set-up


def ensure_wrk() -> None:
    if shutil.which("wrk"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("wrk is missing: apt-get install wrk")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, env=env)
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed and could not be installed (Debian: apt-get install wrk)")


def reference_installed() -> bool:
    pkg = HERE / "node_modules" / REFERENCE_PACKAGE / "package.json"
    wanted = json.loads((HERE / "package.json").read_text())["dependencies"][REFERENCE_PACKAGE]
    try:
        return json.loads(pkg.read_text())["version"] == wanted
    except (OSError, ValueError, KeyError):
        return False


def available(servers: list[str]) -> tuple[list[str], dict[str, str]]:
    """The servers that can run here, and why the others cannot."""
    skipped: dict[str, str] = {}
    if "ours" in servers:
        sys.path.insert(0, str(ROOT / "server"))
        try:
            import stream_server
            import stream_server.server  # noqa: F401  (and what it needs to serve)
        except Exception as exc:  # any import failure means: skip, say why
            skipped["ours"] = f"import stream_server failed: {exc!r}"
    if "reference" in servers:
        if not shutil.which("node") or not shutil.which("npm"):
            skipped["reference"] = "Node.js/npm not installed"
        elif not reference_installed():
            log(f"npm install {REFERENCE_PACKAGE} into {HERE / 'node_modules'}")
            proc = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=HERE,
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0 or not reference_installed():
                skipped["reference"] = f"npm install failed: {proc.stderr[-500:]}"
    if "ceiling" in servers:
        try:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as exc:
            skipped["ceiling"] = f"Starlette/uvicorn missing: {exc!r}"
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    return [s for s in servers if s not in skipped], skipped


def disk_syncs_per_s(workdir: Path, seconds: float = 1.0) -> float:
    """100-byte write + fdatasync, back to back, on the data directories' filesystem."""
    path = workdir / "fdatasync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        n, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            os.write(fd, b"s" * 100)
            os.fdatasync(fd)
            n += 1
        return n / elapsed
    finally:
        os.close(fd)
        path.unlink()


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def versions() -> dict:
    def out(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            return (p.stdout or p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"

    ref = "?"
    with contextlib.suppress(OSError, ValueError, KeyError):
        ref = json.loads((HERE / "node_modules" / REFERENCE_PACKAGE / "package.json").read_text())[
            "version"
        ]
    cpu = "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return {
        "python": platform.python_version(),
        "node": out(["node", "--version"]),
        "wrk": out(["wrk", "-v"]),
        "reference": ref,
        "ours_commit": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "kernel": platform.release(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
    }


# ----------------------------------------------------------------- driver


@contextlib.contextmanager
def baseline_checkout(ref: str | None, workdir: Path):
    """The ``server/`` folder of a temporary git worktree at ``ref`` (None: no baseline)."""
    if ref is None:
        yield None
        return
    tree = workdir / "baseline"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    log(f"baseline: {ref} checked out in {tree}")
    try:
        yield tree / "server"
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )


def merge(runs: list[dict]) -> dict:
    """Several runs of one workload on one server: the median of each figure."""
    if len(runs) == 1:
        return runs[0]
    out = {}
    for key, first in runs[0].items():
        values = [r.get(key) for r in runs]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        out[key] = statistics.median(values) if numeric else first
    out["runs"] = len(runs)
    return out


def run(
    servers: list[str],
    prof: Profile,
    only: list[str],
    workdir: Path,
    repeat: int,
    baseline: Path | None = None,
) -> tuple[dict, dict]:
    """Each workload on ours, then the reference (``repeat`` times, alternating).

    With ``baseline`` (the ``server/`` folder of another checkout), that server
    takes the reference's place, and its figures its column.
    """
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    ceiling = None
    if "ceiling" in servers and (not only or "appends_64x64" in only):
        runs = []
        for _ in range(repeat):
            srv = Server("ceiling", workdir)
            try:
                srv.start()
                log("ceiling: 64 conns x 64 streams")
                runs.append(ceiling_appends(srv, prof))
            except Exception as exc:
                errors["ceiling"] = f"{type(exc).__name__}: {exc}"
                log(f"ceiling FAILED: {exc}")
            finally:
                srv.cleanup()
        ceiling = merge(runs) if runs else None
    for w in WORKLOADS:
        if only and w.key not in only:
            continue
        runs: dict[str, list[dict]] = {}
        for _ in range(repeat):
            for kind in ("ours", "reference"):
                if kind not in servers or kind not in w.servers:
                    continue
                if f"{w.key}/{kind}" in errors:
                    continue
                if kind == "reference" and baseline is not None:
                    log(f"{w.key}: baseline")
                    srv = Server("baseline", workdir, source=baseline)
                else:
                    log(f"{w.key}: {kind}")
                    srv = Server(kind, workdir)
                try:
                    disk = disk_syncs_per_s(workdir, 0.25)  # the disk varies over time
                    srv.start()
                    res = w.run(srv, prof)
                    res["disk_fdatasync_per_s"] = disk
                    runs.setdefault(kind, []).append(res)
                    log(f"{w.key}: {srv.kind}: {short(res)}")
                except Exception as exc:
                    errors[f"{w.key}/{kind}"] = f"{type(exc).__name__}: {exc}"
                    log(f"{w.key}: {srv.kind} FAILED: {exc}")
                finally:
                    srv.cleanup()
        results[w.key] = {kind: merge(r) for kind, r in runs.items()}
    return {"workloads": results, "ceiling": ceiling}, errors


def short(d: dict) -> str:
    return ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in d.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--servers",
        default="ours,reference,ceiling",
        help="comma-separated, from: ours, reference, ceiling (default: all three)",
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of load per wrk workload (default 10; 2 with --quick)",
    )
    ap.add_argument("--quick", action="store_true", help="short smoke profile (CI), < 60 s")
    ap.add_argument(
        "--only", default="", help=f"comma-separated workloads, from: {', '.join(KEYS)}"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each workload N times, alternating the servers; report medians",
    )
    ap.add_argument(
        "--catchup-append",
        type=int,
        default=None,
        metavar="BYTES",
        help="bytes per append when filling the binary catch-up stream "
        "(default 1024: 1 KiB messages; 16384 with --quick)",
    )
    ap.add_argument("--json", dest="json_out", help="also write every figure to this file")
    ap.add_argument(
        "--baseline",
        metavar="REF",
        help="compare with this server at a git ref (before/after) instead of the reference",
    )
    args = ap.parse_args(argv)

    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [s for s in servers if s not in SERVERS] + [k for k in only if k not in KEYS]
    if bad:
        ap.error(f"unknown server or workload: {', '.join(bad)}")
    prof = Profile.make(args.quick, args.duration)
    if args.catchup_append:
        prof.catchup_append = args.catchup_append

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups
    raise_fd_limit()
    ensure_wrk()
    if args.baseline and "reference" not in servers:
        servers.append("reference")  # the baseline runs in the reference's place
    runnable, skipped = available([s for s in servers if not (args.baseline and s == "reference")])
    if args.baseline:
        runnable.append("reference")
    other = f"base {args.baseline}" if args.baseline else "reference"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        machine = {
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0],
            "fdatasync_per_s": disk_syncs_per_s(Path(tmp)),
        }
        with baseline_checkout(args.baseline, Path(tmp)) as baseline:
            figures, errors = run(
                runnable, prof, only, Path(tmp), max(1, args.repeat), baseline=baseline
            )
    elapsed = time.monotonic() - started

    rows = build_rows(prof, figures["workloads"], figures["ceiling"])
    if args.baseline:  # the targets are against the reference, not a baseline
        for row in rows:
            row["target"], row["met"] = "-", None
    print(
        f"machine: {machine['cpus']} CPUs, load average {machine['load_average_at_start']:.1f} "
        f"at start, {machine['fdatasync_per_s']:,.0f} fdatasync/s (100-byte appends, one file)"
    )
    print(table(rows, figures["ceiling"], other))
    print()
    for key, res in figures["workloads"].items():
        for kind, d in res.items():
            label = "baseline" if args.baseline and kind == "reference" else kind
            print(f"  {key} {label}: {short(d)}")
    if figures["ceiling"]:
        print(f"  ceiling: {short(figures['ceiling'])}")
    for name, why in skipped.items():
        print(f"  skipped {name}: {why}")
    for name, why in errors.items():
        print(f"  ERROR {name}: {why}")
    print(f"  profile: {'quick' if prof.quick else 'full'}, {elapsed:.0f} s")

    if args.json_out:
        doc = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "profile": prof.__dict__,
            "long_poll_timeout_s": LONG_POLL_SECONDS,
            "elapsed_s": elapsed,
            "versions": versions(),
            "machine": machine,
            "servers": runnable,
            "baseline": args.baseline,
            "skipped": skipped,
            "errors": errors,
            "ceiling": figures["ceiling"],
            "rows": rows,
            "raw": figures["workloads"],
        }
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
