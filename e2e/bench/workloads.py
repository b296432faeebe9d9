"""The workloads: one function each, taking a started server and the profile, returning a result.

Every result is a dataclass (``results.py``); the table picks its figures
by field name (``report.py``), the JSON keeps them all.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.client import (
    BIN,
    JSON_CT,
    Conn,
    create_streams,
    fill,
    fill_all,
    read_stream,
    request_bytes,
    tails,
    wrk,
)
from bench.results import (
    AppendResult,
    CatchUpResult,
    CeilingResult,
    IdleResult,
    LiveResult,
    Profile,
    RestartResult,
    Result,
    SequentialResult,
)
from bench.servers import LONG_POLL_SECONDS, Server
from testkit.servers import cpu_seconds

MiB = 2**20


class Holdings:
    """How many 100-byte appends ``names`` took since this was made, from their tails:
    what one append adds to an offset on this server is measured first (one append)."""

    def __init__(self, srv: Server, names: list[str]) -> None:
        self.srv, self.names = srv, names
        first = tails(srv, names[:1])
        c = Conn(srv.port)
        try:
            c.request("POST", f"/v1/stream/{names[0]}", BIN, b"x" * 100)
        finally:
            c.close()
        self.before = tails(srv, names)
        self.step = self.before[0] - first[0] if self.before and first else 0

    def since(self, acked: int) -> int | None:
        """The appends held now; RuntimeError when fewer than ``acked`` were acknowledged
        (a few more is fine: those in flight when the load stopped). None: not known."""
        after = tails(self.srv, self.names)
        if self.step <= 0 or not self.before or not after:
            return None
        held = sum(a - b for a, b in zip(after, self.before, strict=True)) // self.step
        if held < acked:
            raise RuntimeError(f"{self.srv.kind} holds {held} appends, {acked} were acknowledged")
        return held


def appends(srv: Server, prof: Profile, *, streams: int, threads: int) -> AppendResult:
    """64 connections POST 100-byte appends over ``streams`` streams for the duration.

    Afterwards the streams' tails say how many appends the server holds; it
    must hold at least as many as wrk saw acknowledged (it may hold a few
    more: those in flight when wrk stopped).
    """
    prefix = f"a{streams}-"
    names = [f"{prefix}{i}" for i in range(streams)]
    create_streams(srv, names)
    held_now = Holdings(srv, names)
    kw = dict(threads=threads, connections=64, prefix=prefix, streams=streams)
    acked = 0
    if prof.warmup:
        acked += wrk(srv, seconds=prof.warmup, **kw).ok
    pids = srv.pids()
    cpu_before = [cpu_seconds(p) for p in pids]
    loop_before = cpu_seconds(pids[0], thread=pids[0])
    kernel_before = cpu_seconds(pids[0], kernel=True)
    st = wrk(srv, seconds=prof.duration, **kw)
    cpu_used = [cpu_seconds(p) - b for p, b in zip(pids, cpu_before, strict=True)]
    loop_used = cpu_seconds(pids[0], thread=pids[0]) - loop_before
    kernel_used = cpu_seconds(pids[0], kernel=True) - kernel_before
    acked += st.ok
    held = held_now.since(acked)
    return AppendResult(
        appends_per_s=st.rate,
        p50_ms=st.p50_us / 1000,
        p99_ms=st.p99_us / 1000,
        errors=st.errors,
        acknowledged=acked,
        held=held,
        cpu_ms=tuple(1000 * u / max(st.requests, 1) for u in cpu_used),
        cpu_ms_loop=1000 * loop_used / max(st.requests, 1),
        cpu_ms_kernel=1000 * kernel_used / max(st.requests, 1),
    )


def ceiling_appends(srv: Server, prof: Profile) -> CeilingResult:
    """The 64 x 64 append workload, verbatim, against the ceiling app (no PUTs needed)."""
    kw = dict(threads=64, connections=64, prefix="a64-", streams=64)
    if prof.warmup:
        wrk(srv, seconds=prof.warmup, **kw)
    st = wrk(srv, seconds=prof.duration, **kw)
    return CeilingResult(
        appends_per_s=st.rate, p50_ms=st.p50_us / 1000, p99_ms=st.p99_us / 1000, errors=st.errors
    )


def sequential(srv: Server, prof: Profile) -> SequentialResult:
    """One connection, one request at a time (wrk -t1 -c1): append latency."""
    create_streams(srv, ["seq-0"])
    kw = dict(threads=1, connections=1, prefix="seq-", streams=1)
    if prof.warmup:
        wrk(srv, seconds=prof.warmup, **kw)
    pids = srv.pids()
    before = [cpu_seconds(p) for p in pids]
    st = wrk(srv, seconds=prof.duration, **kw)
    used = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    return SequentialResult(
        p50_ms=st.p50_us / 1000,
        p99_ms=st.p99_us / 1000,
        appends_per_s=st.rate,
        errors=st.errors,
        cpu_ms=tuple(1000 * u / max(st.requests, 1) for u in used),
    )


def catch_up(srv: Server, prof: Profile, *, json_mode: bool) -> CatchUpResult:
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
    passes = [read_stream(srv, path) for _ in range(2 if prof.quick else 3)]
    for p in passes:
        if expected is not None and p.bytes != expected:
            raise RuntimeError(f"catch-up read {p.bytes} bytes, expected {expected}")
        if p.bytes < prof.catchup_mib * MiB:
            raise RuntimeError(f"catch-up read only {p.bytes} bytes")
    rates = [p.bytes / MiB / p.seconds for p in passes]
    return CatchUpResult(
        mib_per_s=statistics.median(rates),
        passes_mib_per_s=[round(r, 1) for r in rates],
        bytes=passes[0].bytes,
        requests=passes[0].requests,
        fill_seconds=round(fill_seconds, 1),
        append_bytes=1024 * 1024 if json_mode else prof.catchup_append,
    )


def live(srv: Server, prof: Profile) -> LiveResult:
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
    return LiveResult(
        p50_ms=statistics.median(lat), p99_ms=percentile(lat, 99), max_ms=lat[-1], rounds=len(lat)
    )


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def idle_readers(srv: Server, prof: Profile) -> IdleResult:
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
    return IdleResult(
        wake_p99_ms=percentile(lat, 99),
        wake_p50_ms=percentile(lat, 50),
        wake_max_ms=lat[-1] if lat else float("nan"),
        woken=len(woken),
        readers=n,
        streams=s,
        answered_before_append=len(early),
        posts_ok=sum(1 for st in post_status if st in (200, 204)),
        kib_per_waiter=max(0, rss_idle - rss_before) / n / 1024,
        rss_idle_mib=rss_idle / MiB,
    )


def restart(srv: Server, prof: Profile) -> RestartResult:
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
    puts = fill(srv, (request_bytes("PUT", f"/v1/stream/{x}", BIN) for x in names), conns)
    if puts.ok != n:
        raise RuntimeError(
            f"restart fill: {puts.ok} of {n} streams created: {puts.bad} {len(puts.again)}x 404"
        )
    body = b"r" * size
    posts = (request_bytes("POST", f"/v1/stream/{name}", BIN, body) for name in names)
    ok, _ = fill_all(srv, posts, connections=conns)
    if ok != n:
        raise RuntimeError(f"restart fill: {ok} of {n} appends acknowledged")
    fill_seconds = time.monotonic() - started
    rss_full = srv.rss()
    srv.stop()
    assert srv.data_dir is not None
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
    return RestartResult(
        seconds_to_ready=seconds,
        rss_mib=rss_ready / MiB,
        rss_before_restart_mib=rss_full / MiB,
        streams=n,
        bytes_per_stream=size,
        data_mib=n * size / MiB,
        on_disk_mib=on_disk / MiB,
        fill_seconds=round(fill_seconds, 1),
    )


def dir_bytes(path: Path) -> int:
    """The disk space the files under ``path`` take (allocated blocks)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def many_streams(srv: Server, prof: Profile) -> Result:
    """N small streams on one server, stopped, restarted and killed: many_streams.py
    (imported here, not above: it uses this module's helpers)."""
    from bench import many_streams as workload

    return workload.many_streams(srv, prof)


# ------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Workload:
    key: str
    run: Callable[[Server, Profile], Result]
    uses_wrk: bool = False


WORKLOADS = [
    Workload("appends_64x64", lambda s, p: appends(s, p, streams=64, threads=64), uses_wrk=True),
    Workload("appends_64x1", lambda s, p: appends(s, p, streams=1, threads=2), uses_wrk=True),
    Workload("sequential", sequential, uses_wrk=True),
    Workload("catchup_bin", lambda s, p: catch_up(s, p, json_mode=False)),
    Workload("catchup_json", lambda s, p: catch_up(s, p, json_mode=True)),
    Workload("live", live),
    Workload("idle", idle_readers),
    Workload("restart", restart),
    Workload("many", many_streams),
]
KEYS = [w.key for w in WORKLOADS]
CEILING_WORKLOAD = "appends_64x64"  # the ceiling runs with it, the same way
