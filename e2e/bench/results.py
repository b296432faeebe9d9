"""The profile a run uses, and the typed result of each workload."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, TypeVar


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
    many_streams: int  # streams of the many-streams workload (many_streams.py)

    @classmethod
    def make(cls, quick: bool, duration: float | None) -> Profile:
        if quick:
            # The restart at 500 streams / 5 MiB: a smoke of it (fill, stop, start, read
            # back), where 2,000 / 20 MiB cost the reference's one-connection fill most
            # of the quick profile's CPU.
            return cls(True, duration or 2, 0, 4, 16 * 1024, 40, 200, 20, 500, 5, 2000)
        return cls(False, duration or 10, 2, 100, 1024, 500, 1000, 100, 100_000, 1024, 100_000)


@dataclass(kw_only=True)
class Result:
    """What every workload run also records: the disk's speed just before it, and how many
    runs a merged result stands for (their medians, with --repeat)."""

    disk_fdatasync_per_s: float | None = None
    runs: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The workload's own figures first, then these two."""
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if k not in _COMMON} | {k: d[k] for k in _COMMON}


_COMMON = ("disk_fdatasync_per_s", "runs")


@dataclass
class AppendResult(Result):
    appends_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    acknowledged: int  # what wrk saw acknowledged, warm-up included
    held: int | None  # what the streams' tails account for afterwards (None: not measurable)
    cpu_ms: tuple[float, ...] = ()  # CPU per append of each server process, as SequentialResult's
    cpu_ms_loop: float = 0.0  # of the first process's main thread (its event loop)
    cpu_ms_kernel: float = 0.0  # of the first process, in the kernel (its system calls)


@dataclass
class CeilingResult(Result):
    appends_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


@dataclass
class SequentialResult(Result):
    p50_ms: float
    p99_ms: float
    appends_per_s: float
    errors: int
    # CPU (user and system) per append of each server process, from /proc: the
    # figure that the machine's noise moves least (a replica set: the primary first).
    cpu_ms: tuple[float, ...] = ()


@dataclass
class CatchUpResult(Result):
    mib_per_s: float  # the median of the passes
    passes_mib_per_s: list[float]
    bytes: int
    requests: int
    fill_seconds: float
    append_bytes: int


@dataclass
class LiveResult(Result):
    p50_ms: float
    p99_ms: float
    max_ms: float
    rounds: int


@dataclass
class IdleResult(Result):
    wake_p99_ms: float
    wake_p50_ms: float
    wake_max_ms: float
    woken: int
    readers: int
    streams: int
    answered_before_append: int  # readers answered before any append: should be none
    posts_ok: int
    kib_per_waiter: float
    rss_idle_mib: float


@dataclass
class RestartResult(Result):
    seconds_to_ready: float
    rss_mib: float
    rss_before_restart_mib: float
    streams: int
    bytes_per_stream: int
    data_mib: float
    on_disk_mib: float
    fill_seconds: float


@dataclass
class ManyStreamsResult(Result):
    """One server holding ``streams`` small streams (many_streams.py): times from its
    fresh start to a kill -9 and back. Per-stream figures divide by ``streams``."""

    streams: int
    connections: int  # the fill's (the reference needs one for its appends)
    creates_per_s: float
    appends_per_s: float  # one 100-byte POST to each stream
    p50_ms: float  # every append of that fill
    p99_ms: float
    max_ms: float
    over_1s: int  # appends that took more than a second
    checkpoints: int | None  # checkpoints running during the appends (None: not observable)
    checkpoints_in_creates: int | None  # begun before the first append
    checkpoint_s: float | None  # seconds of the appends' fill spent checkpointing
    slowest_in_checkpoint: int | None  # of the 10 slowest stalls, those overlapping one
    over_1s_in_checkpoint: int | None  # of the appends over 1 s, those overlapping one
    # (start, end) of each checkpoint window, seconds from the start of the appends
    checkpoint_windows: list[tuple[float, float]]
    # (seconds from the start, ms): the 10 slowest appends, one per stall (not overlapping)
    slowest: list[tuple[float, float]]
    rss_empty_mib: float  # the fresh server's
    rss_full_mib: float  # after the fill
    rss_bytes_per_stream: float  # (after the fill - empty) / streams
    disk_bytes_per_stream: float  # the data directory's blocks after the clean stop / streams
    stop_s: float  # SIGTERM to exit
    stop_status: int | None  # the exit status (-15: killed by the SIGTERM itself)
    restart_s: float  # spawn to ready, after the clean stop
    restart_rss_bytes_per_stream: float  # (RSS when ready - empty) / streams
    more_appends: int  # a second append to this many streams before the kill
    kill_restart_s: float  # spawn to ready after kill -9
    checked_streams: int  # reads of a whole stream compared with what it must hold, both starts


@dataclass
class ReplicationResult(Result):
    """One side of the replicated workload: single-node ours (``replicas`` 1, no lag
    figures) or the replica set, through its primary."""

    replicas: int
    appends_per_s: float  # 64 conns x 64 streams
    p50_ms: float
    p99_ms: float
    errors: int
    acknowledged: int
    held: int | None  # on the primary (single node: the server)
    seq_p50_ms: float  # 1 client, one append at a time
    seq_p99_ms: float
    seq_appends_per_s: float
    seq_errors: int
    seq_cpu_ms: float | None = None  # CPU per sequential append, all the side's servers
    seq_cpu_ms_primary: float | None = None  # the primary's (single node: the server's)
    seq_cpu_ms_standby: float | None = None  # each standby's, their mean
    cpu_ms: float | None = None  # CPU per 64 x 64 append, all the side's servers
    cpu_ms_primary: float | None = None  # as for the sequential ones
    cpu_ms_standby: float | None = None
    # The worst standby at each sample of the primary's metrics during the appends:
    lag_bytes_p50: float | None = None
    lag_bytes_max: float | None = None
    lag_seconds_p50: float | None = None
    lag_seconds_max: float | None = None
    lag_frames_max: float | None = None
    lag_samples: int | None = None
    catch_up_s: float | None = None  # after the appends, until every standby held all
    identical: int | None = None  # replicas whose streams equal the primary's, byte for byte
    data_bytes: int | None = None  # the bytes compared on each replica


@dataclass
class ArchiveResult(Result):
    """One side of the archived workload: ours without the archive ("off") or with it
    ("on", lag figures from ``/_archive/status``)."""

    appends_per_s: float  # 64 conns x 64 streams
    p50_ms: float
    p99_ms: float
    errors: int
    seq_p50_ms: float  # 1 client, one append at a time
    seq_p99_ms: float
    seq_appends_per_s: float
    seq_errors: int
    cpu_ms: float | None = None  # CPU per 64 x 64 append
    lag_seconds_p50: float | None = None  # the archive's lag at each sample under the appends
    lag_seconds_p99: float | None = None
    lag_bytes_max: float | None = None
    lag_samples: int | None = None
    catch_up_s: float | None = None  # after the appends, until the archive held every frame
    archived_all: bool | None = None  # the archive's last lsn is the server's


@dataclass
class WorkersResult(Result):
    """One side of the workers workload: ours with ``workers`` worker processes (1: the
    single process) and, beside it, the HTTP ceiling in as many processes."""

    workers: int
    processes: int  # the server's processes whose CPU is counted (the main one and its children)
    appends_per_s: float  # 64 conns x 64 streams
    p50_ms: float
    p99_ms: float
    errors: int
    acknowledged: int
    held: int | None
    appends_1_per_s: float  # 64 conns x 1 stream
    appends_1_errors: int
    catchup_mib_per_s: float  # binary
    cpu_ms: float  # CPU per 64 x 64 append, every process of the server
    cpu_ms_writer: float  # the main process's alone: the writer's (1 worker: everything)
    cpu_ms_writer_loop: float  # of that, its event loop's (the rest: its commit thread, mostly)
    cpu_ms_writer_kernel: float  # of that, in the kernel: its system calls, every thread
    requests_per_batch: float | None  # the writer's, during the 64 x 64 run (None: no batch)
    live_p50_ms: float
    live_p99_ms: float
    idle_wake_p99_ms: float
    idle_woken: int
    idle_readers: int
    ceiling_appends_per_s: float | None = None  # the ceiling app in ``workers`` processes
    ceiling_share_pct: float | None = None  # appends_per_s over that, in %
    writer_alone_per_s: float | None = None  # N > 1: the writer fed over links alone
    writer_alone_cpu_ms: float | None = None  # its CPU per append then (every thread)
    writer_alone_per_batch: float | None = None  # its requests per batch then


R = TypeVar("R", bound=Result)


def merge(runs: list[R]) -> R:
    """Several runs of one workload on one server: the median of each number."""
    if len(runs) == 1:
        return runs[0]
    merged: dict[str, Any] = {}
    for f in dataclasses.fields(runs[0]):
        values = [getattr(r, f.name) for r in runs]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if not numeric:
            merged[f.name] = values[0]
        elif all(isinstance(v, int) for v in values):
            merged[f.name] = statistics.median_low(values)  # stays a count
        else:
            merged[f.name] = statistics.median(values)
    merged["runs"] = len(runs)
    return dataclasses.replace(runs[0], **merged)
