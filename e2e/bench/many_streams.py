"""The many-streams workload: one server holding very many small streams (issue 29).

Durable Streams are used one per chat, per document, per agent session, so
a server holds very many small streams. On one fresh server this workload
creates ``--many-streams`` N streams (PUT, over many connections), appends one
100-byte record to each (POST), timing every append, then stops the server
cleanly (SIGTERM), starts it again, appends a second record to half of the
streams, kills it (SIGKILL) and starts it once more. It reports the create and
append rates, the appends' latency (p50, p99, max, how many took over a
second), the memory and disk each stream costs, the clean stop (its seconds
and exit status), the restart and the crash recovery (seconds to ready).

Stalls are what it looks for: an append waiting seconds behind a checkpoint.
Our server's checkpoints are seen from outside, in its data directory: a
checkpoint rotates the WAL (a new file in ``wal/``) and deletes the old files
once it has flushed what they cover (``engine/checkpoints.py``), so while
``wal/`` holds more than one file a checkpoint runs. A thread of this process
looks every 10 ms (no request to the server, which a ``/metrics`` scrape
would be, with its sums over every stream; and it works on any past
checkout, for ``--baseline``). Each of the slowest appends is set against
those windows. The reference has no checkpoints: its columns say "-".

After each start a sample of the streams is read back and compared byte for
byte (every record in it, in order): data missing after a restart or a crash
fails the workload.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from types import TracebackType

from bench.client import BIN, Conn, fill, fill_all, request_bytes
from bench.results import ManyStreamsResult, Profile
from bench.servers import OURS, Server
from bench.workloads import dir_bytes, percentile

MiB = 2**20
CONNECTIONS = 64  # as many as the 64 x 64 append workload
START_TIMEOUT = 1800  # seconds to ready: the point is to measure it, however long
STOP_TIMEOUT = 120  # SIGTERM, then SIGKILL (exit status -9) after this long
SLOWEST = 10  # appends listed and set against the checkpoint windows
SAMPLE = 24  # streams read back after each start, besides the first and last


def path(i: int) -> str:
    return f"/v1/stream/ms/{i}"


def record(i: int, nth: int) -> bytes:
    """The ``nth`` record of stream ``i``: 100 bytes that say whose they are."""
    return f"{nth}:{i}:".encode().ljust(100, b".")


def posts(indexes: range, nth: int):
    return (request_bytes("POST", path(i), BIN, record(i, nth)) for i in indexes)


class CheckpointWatch:
    """The windows in which our server checkpoints, seen in its ``wal/`` directory.

    While ``wal/`` holds more than one ``*.wal`` file, a checkpoint runs; a
    higher file number with a single file means a whole checkpoint ran between
    two looks (a window one poll long). Times are ``time.perf_counter()``.
    """

    def __init__(self, wal_dir: Path, poll: float = 0.01) -> None:
        self.wal_dir = wal_dir
        self.poll = poll
        self.windows: list[tuple[float, float]] = []
        self._since: float | None = None  # start of the open window
        self._last = -1  # the highest WAL file number seen
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-watch", daemon=True)

    def __enter__(self) -> CheckpointWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()

    @property
    def running(self) -> bool:
        """A checkpoint ran at the last look."""
        return self._since is not None

    def _numbers(self) -> list[int]:
        try:
            with os.scandir(self.wal_dir) as it:
                return sorted(int(e.name[:-4]) for e in it if e.name.endswith(".wal"))
        except (OSError, ValueError):
            return []

    def look(self) -> None:
        """One look at ``wal/``: open a window, close it, or record a whole one."""
        numbers = self._numbers()
        now = time.perf_counter()
        top = numbers[-1] if numbers else self._last
        if len(numbers) > 1:
            self._since = now if self._since is None else self._since
        elif self._since is not None:
            self.windows.append((self._since, now))
            self._since = None
        elif self._last >= 0 and top > self._last:
            self.windows.append((now - self.poll, now))
        self._last = max(self._last, top)

    def _run(self) -> None:
        self.look()
        while not self._done.wait(self.poll):
            self.look()
        if self._since is not None:
            self.windows.append((self._since, time.perf_counter()))


def check_streams(srv: Server, n: int, twice: int = 0) -> int:
    """Read back a sample of the streams: each must hold exactly its records, the
    first ``twice`` streams two, the others one. Raises on any difference;
    returns how many streams were compared."""
    rng = random.Random(n)
    sample = {0, n - 1, *(rng.randrange(n) for _ in range(SAMPLE))}
    if twice:
        sample |= {twice - 1, twice % n, *(rng.randrange(twice) for _ in range(SAMPLE))}
    c = Conn(srv.port)
    try:
        for i in sorted(sample):
            want = b"".join(record(i, k) for k in range(1, 3 if i < twice else 2))
            status, _, body = c.request("GET", f"{path(i)}?offset=-1")
            if status != 200 or body != want:
                raise RuntimeError(
                    f"{srv.kind}: stream ms/{i} answered {status} with {len(body)} bytes "
                    f"{body[:60]!r}..., expected {len(want)} bytes {want[:60]!r}..."
                )
    finally:
        c.close()
    return len(sample)


def stalls(timings: list[tuple[float, float]], k: int) -> list[tuple[float, float]]:
    """The ``k`` slowest appends that did not wait at the same time: one per stall
    (a stall holds up every append in flight, and would fill the list alone)."""
    out: list[tuple[float, float]] = []
    for sent, took in sorted(timings, key=lambda t: -t[1]):
        if len(out) == k:
            break
        if not _overlaps(sent, took, [(s, s + d) for s, d in out]):
            out.append((sent, took))
    return out


def _overlaps(sent: float, seconds: float, windows: list[tuple[float, float]]) -> bool:
    return any(sent < b and sent + seconds > a for a, b in windows)


def many_streams(srv: Server, prof: Profile) -> ManyStreamsResult:
    """The whole sequence on one server: fill, clean stop, restart, more appends, kill -9."""
    n = prof.many_streams
    assert srv.data_dir is not None
    ours = srv.kind in OURS
    # The reference answers 404 to appends to many streams at once and may keep
    # the bytes of such an append in its file (workloads.restart): one
    # connection for its appends keeps its data exact. Its creates are fine.
    append_conns = 1 if srv.kind == "reference" else CONNECTIONS
    rss_empty = srv.rss()
    timings: list[tuple[float, float]] = []
    watch = CheckpointWatch(srv.data_dir / "wal")
    with watch:
        puts = fill(srv, (request_bytes("PUT", path(i), BIN) for i in range(n)), CONNECTIONS)
        if puts.ok != n:
            raise RuntimeError(
                f"{puts.ok} of {n} streams created: {puts.bad} {len(puts.again)}x 404"
            )
        started = time.perf_counter()
        ok, fill_s = fill_all(srv, posts(range(n), 1), append_conns, timings=timings)
        ended = time.perf_counter()
        if ok != n:
            raise RuntimeError(f"{ok} of {n} appends acknowledged")
    rss_full = srv.rss()
    windows = [(a - started, b - started) for a, b in watch.windows if b > started and a < ended]
    lat = sorted(s * 1000 for _, s in timings)
    slowest = stalls(timings, SLOWEST)
    over = [(s, d) for s, d in timings if d > 1]

    t = time.monotonic()
    status = srv.stop(timeout=STOP_TIMEOUT)
    stop_s = time.monotonic() - t
    disk = dir_bytes(srv.data_dir)
    restart_s = srv.start(srv.data_dir, timeout=START_TIMEOUT)
    rss_restart = srv.rss()
    checked = check_streams(srv, n)

    more = n // 2  # a second record each, so that the WAL holds something at the kill
    ok, _ = fill_all(srv, posts(range(more), 2), append_conns)
    if ok != more:
        raise RuntimeError(f"{ok} of {more} second appends acknowledged")
    srv.kill()
    kill_restart_s = srv.start(srv.data_dir, timeout=START_TIMEOUT)
    checked += check_streams(srv, n, twice=more)

    return ManyStreamsResult(
        streams=n,
        connections=append_conns,
        creates_per_s=n / puts.seconds,
        appends_per_s=n / fill_s,
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        max_ms=lat[-1],
        over_1s=sum(1 for x in lat if x > 1000),
        checkpoints=len(windows) if ours else None,
        checkpoints_in_creates=sum(1 for a, _ in watch.windows if a < started) if ours else None,
        checkpoint_s=round(sum(min(b, ended - started) - max(a, 0) for a, b in windows), 2)
        if ours
        else None,
        slowest_in_checkpoint=sum(1 for s, d in slowest if _overlaps(s, d, watch.windows))
        if ours
        else None,
        over_1s_in_checkpoint=sum(1 for s, d in over if _overlaps(s, d, watch.windows))
        if ours
        else None,
        checkpoint_windows=[(round(a, 2), round(b, 2)) for a, b in windows],
        slowest=[(round(s - started, 2), round(d * 1000, 1)) for s, d in slowest],
        rss_empty_mib=rss_empty / MiB,
        rss_full_mib=rss_full / MiB,
        rss_bytes_per_stream=(rss_full - rss_empty) / n,
        disk_bytes_per_stream=disk / n,
        stop_s=stop_s,
        stop_status=status,
        restart_s=restart_s,
        restart_rss_bytes_per_stream=(rss_restart - rss_empty) / n,
        more_appends=more,
        kill_restart_s=kill_restart_s,
        checked_streams=checked,
    )


def describe(kind: str, res: ManyStreamsResult) -> str:
    """The checkpoint windows of the appends' fill and its slowest appends, on a few lines."""
    conns = f"{res.connections} connection{'s' if res.connections != 1 else ''}"
    head = f"many streams, {kind} ({res.streams:,} streams, appends over {conns})"
    if res.checkpoints is None:
        windows = "checkpoints: none to observe"
    else:
        spans = ", ".join(f"{a:.1f}-{b:.1f}" for a, b in res.checkpoint_windows) or "none"
        windows = (
            f"checkpoints while creating: {res.checkpoints_in_creates}; "
            f"checkpoint windows (s from the first append): {spans}"
        )
    inside = [
        any(a <= s + ms / 1000 and s <= b for a, b in res.checkpoint_windows)
        for s, ms in res.slowest
    ]
    over = (
        ""
        if res.over_1s_in_checkpoint is None
        else f"; appends over 1 s in a window: {res.over_1s_in_checkpoint:,} of {res.over_1s:,}"
    )
    slow = ", ".join(
        f"{ms:,.0f} ms at {s:.1f} s{' [C]' if c else ''}"
        for (s, ms), c in zip(res.slowest, inside, strict=True)
    )
    return (
        f"{head}:\n  {windows}{over}\n"
        f"  slowest appends, one per stall ([C]: in a checkpoint window): {slow}"
    )
