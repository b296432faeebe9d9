"""Prometheus metrics: where the time of a durable append goes, and the rest.

Names follow Prometheus conventions (base units, ``_seconds``, ``_bytes``,
``_total``). Labels are bounded: HTTP method, status code, mode, event kind;
never a stream path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stream_server.engine import BatchStats, RecoveryProgress
from stream_server.request_metrics import (
    LATENCY_BUCKETS,
    PREFIX,
    SIZE_BUCKETS,
    PodRequests,
    RequestMetrics,
)

disable_created_metrics()  # type: ignore[no-untyped-call]  # the *_created series are noise

COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Metrics(RequestMetrics):
    """Every metric of the server: its requests' (``RequestMetrics``), and the engine's,
    the disk's, recovery's, subscriptions'..."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        super().__init__(self.registry)
        # Requests are counted where they are served: by the workers, with --workers N.
        self.counts_requests = True
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry

        def hist(
            name: str,
            doc: str,
            buckets: Sequence[float] = LATENCY_BUCKETS,
            labels: Sequence[str] = (),
        ) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, labels, registry=r, buckets=buckets)

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=r)

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", doc, labels, registry=r)

        self.fsync_seconds = hist("fsync_duration_seconds", "WAL fdatasync time per batch.")
        self.write_seconds = hist(
            "segment_write_duration_seconds", "Time to write a batch's records to segment files."
        )
        self.commit_seconds = hist(
            "metadata_commit_duration_seconds", "LMDB commit time per batch."
        )
        self.batch_appends = hist(
            "batch_appends", "Appended records per group-commit batch.", COUNT_BUCKETS
        )
        self.batch_requests = hist(
            "batch_requests", "Write requests per group-commit batch.", COUNT_BUCKETS
        )
        self.batch_bytes = hist(
            "batch_bytes", "Payload bytes per group-commit batch.", SIZE_BUCKETS
        )

        self.appends = counter("appends_total", "Appended records (JSON messages count one each).")
        self.appended_bytes = counter("appended_bytes_total", "Payload bytes appended.")
        self.producer_events = counter(
            "producer_events_total", "Idempotent-producer outcomes.", ("event",)
        )
        self.streams_created = counter("streams_created_total", "Streams created.")
        self.forks_created = counter("forks_created_total", "Forks created.")
        self.streams_deleted = counter(
            "streams_deleted_total", "Streams deleted, by reason.", ("reason",)
        )
        self.batches = counter("batches_total", "Group-commit batches committed.")
        self.batch_failures = counter(
            "batch_failures_total", "Group-commit batches that failed.", ("reason",)
        )

        self.streams = gauge("streams", "Streams held (including soft-deleted).")
        # With workers too: their live readers hold the writer's slots (the pod's).
        self.live_readers = gauge("live_readers", "Open live reads.", ("mode",))
        self.disk_bytes = gauge("disk_bytes", "Bytes of the data directory on disk.", ("part",))
        self.disk_free = gauge("disk_free_bytes", "Free bytes on the data directory's filesystem.")
        self.disk_total = gauge("disk_total_bytes", "Size of the data directory's filesystem.")
        # One segment file per stream: a volume of many small streams runs out of
        # inodes while its bytes look fine.
        self.inodes_free = gauge(
            "disk_free_inodes", "Free inodes on the data directory's filesystem."
        )
        self.inodes_total = gauge(
            "disk_total_inodes", "Inodes of that filesystem (0: it has no fixed number)."
        )
        self.recovering = gauge("recovering", "1 while recovery runs (the socket is open).")
        self.recovery_interrupted = gauge(
            "recovery_interrupted",
            "Earlier starts killed before this recovery finished (an OOM kill, say).",
        )
        self.recovery_seconds = gauge(
            "recovery_duration_seconds",
            "Recovery time at start, the streams' loading included (so far, while it runs).",
        )
        self.startup_seconds = gauge(
            "startup_duration_seconds",
            "From the process's start to ready (so far, while it starts).",
        )
        self.recovery_streams = gauge(
            "recovery_streams", "Streams with data that recovery checks (known once loaded)."
        )
        self.recovery_checked = gauge(
            "recovery_streams_checked", "Streams whose segment file recovery has checked."
        )
        self.recovery_frames = gauge(
            "recovery_wal_frames", "WAL frames replayed at start (so far, while it runs)."
        )
        self.ready = gauge("ready", "1 when recovery finished and storage is healthy.")
        self.storage_failed = gauge("storage_failed", "1 when storage failed closed.")

        # Subscriptions (PROTOCOL.md 6 and 7): labels are the type and the outcome only.
        self.subscriptions = gauge("subscriptions", "Subscriptions held, by type.", ("type",))
        self.subscription_wakes = counter(
            "subscription_wakes_total", "Wakes issued (new generations), by type.", ("type",)
        )
        self.subscription_deliveries = counter(
            "subscription_deliveries_total",
            "Webhook delivery attempts, by outcome (ok, http_error, timeout, network_error, "
            "rejected).",
            ("outcome",),
        )
        self.subscription_retries = counter(
            "subscription_retries_total", "Webhook deliveries scheduled for a retry."
        )
        self.subscription_claims = counter("subscription_claims_total", "Pull-wake leases granted.")
        self.subscription_lease_expiries = counter(
            "subscription_lease_expiries_total", "Leases that ran out without done or release."
        )
        self.subscription_wake_latency = hist(
            "subscription_wake_latency_seconds",
            "From the append that made work pending to the wake reaching a worker "
            "(webhook accepted, pull-wake event written or claimed).",
        )
        self.subscription_pending_streams = gauge(
            "subscription_pending_streams", "Linked streams with data past their cursor."
        )
        self.subscriptions_failing = gauge(
            "subscriptions_failing",
            "Webhook subscriptions whose last delivery failed (status failed).",
        )
        for kind in ("webhook", "pull-wake"):  # every series from the start: rate() sees the first
            self.subscriptions.labels(kind)
            self.subscription_wakes.labels(kind)
        for outcome in ("ok", "http_error", "timeout", "network_error", "rejected"):
            self.subscription_deliveries.labels(outcome)

    # Wiring -------------------------------------------------------------------

    def bind(
        self,
        *,
        streams: Callable[[], int],
        live: Callable[[str], int],
        data_dir: str,
        segment_bytes: Callable[[], int],
        ready: Callable[[], bool],
        failed: Callable[[], bool],
        recovering: Callable[[], bool] = lambda: False,
        recovery: RecoveryProgress | None = None,
        recovery_seconds: Callable[[], float] = lambda: 0.0,
        startup_seconds: Callable[[], float] = lambda: 0.0,
        recovery_interrupted: Callable[[], int] = lambda: 0,
    ) -> None:
        """Gauges computed at scrape time from the running server."""
        self.streams.set_function(streams)
        for mode in ("long-poll", "sse"):
            self.live_readers.labels(mode).set_function(partial(live, mode))
        self.disk_bytes.labels("segments").set_function(segment_bytes)
        self.disk_bytes.labels("wal").set_function(lambda: _dir_size(os.path.join(data_dir, "wal")))
        self.disk_bytes.labels("metadata").set_function(
            lambda: _dir_size(os.path.join(data_dir, "meta"))
        )
        self.disk_free.set_function(lambda: _disk(data_dir).free)
        self.disk_total.set_function(lambda: _disk(data_dir).total)
        self.inodes_free.set_function(lambda: _inodes(data_dir)[0])
        self.inodes_total.set_function(lambda: _inodes(data_dir)[1])
        progress = recovery or RecoveryProgress()
        self.recovering.set_function(lambda: 1.0 if recovering() else 0.0)
        self.recovery_interrupted.set_function(recovery_interrupted)
        self.recovery_seconds.set_function(recovery_seconds)
        self.startup_seconds.set_function(startup_seconds)
        self.recovery_streams.set_function(lambda: progress.streams_total)
        self.recovery_checked.set_function(lambda: progress.streams_checked)
        self.recovery_frames.set_function(lambda: progress.wal_frames)
        self.ready.set_function(lambda: 1.0 if ready() else 0.0)
        self.storage_failed.set_function(lambda: 1.0 if failed() else 0.0)
        for event in ("duplicate", "fenced", "gap"):
            self.producer_events.labels(event)
        for reason in ("deleted", "expired"):
            self.streams_deleted.labels(reason)
        for reason in ("disk_full", "error"):
            self.batch_failures.labels(reason)

    def bind_subscriptions(
        self, *, pending_streams: Callable[[], int], failing: Callable[[], int]
    ) -> None:
        """Subscription gauges computed at scrape time."""
        self.subscription_pending_streams.set_function(pending_streams)
        self.subscriptions_failing.set_function(failing)

    def on_batch(self, stats: BatchStats, requests: int) -> None:
        self.batches.inc()
        self.batch_requests.observe(requests)
        self.batch_appends.observe(stats.appends)
        self.batch_bytes.observe(stats.bytes)
        self.write_seconds.observe(stats.write_seconds)
        self.fsync_seconds.observe(stats.fsync_seconds)
        self.commit_seconds.observe(stats.commit_seconds)
        self.appends.inc(stats.appends)
        self.appended_bytes.inc(stats.bytes)

    def gather_workers(self, directory: str) -> None:
        """With ``--workers N``: the request families become the pod's (the workers'
        multiprocess files in ``directory`` plus this process's own), and this process
        counts no request itself (the workers counted those they relay here)."""
        own = self.served()
        for collector in own:
            self.registry.unregister(collector)
        self.registry.register(PodRequests(directory, own))
        self.counts_requests = False

    def bind_retention(
        self,
        *,
        reclaimed: Callable[[], int],
        policies: Callable[[], dict[str, tuple[int, float]]],
    ) -> None:
        """Retention series, read at scrape time (docs/retention.md). The ``policy`` label
        is a configured prefix: as many values as the operator wrote policies."""
        self.registry.register(_RetentionCollector(reclaimed, policies))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _RetentionCollector:
    """Bytes given back by punching (a counter), and per policy the bytes its streams
    retain and the age of their oldest retained record."""

    def __init__(
        self,
        reclaimed: Callable[[], int],
        policies: Callable[[], dict[str, tuple[int, float]]],
    ) -> None:
        self._reclaimed = reclaimed
        self._policies = policies

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            f"{PREFIX}_retention_reclaimed_bytes",
            "Disk space retention gave back (holes punched below retained starts)",
        )
        total.add_metric([], float(self._reclaimed()))
        retained = GaugeMetricFamily(
            f"{PREFIX}_retention_retained_bytes",
            "Bytes of records the streams under a retention policy still hold",
            labels=["policy"],
        )
        oldest = GaugeMetricFamily(
            f"{PREFIX}_retention_oldest_age_seconds",
            "Age of the oldest record the streams under a retention policy still hold "
            "(as of the last sweep; 0 when they hold none)",
            labels=["policy"],
        )
        for prefix, (size, age) in sorted(self._policies().items()):
            retained.add_metric([prefix], float(size))
            oldest.add_metric([prefix], age)
        yield total
        yield retained
        yield oldest


def _dir_size(path: str) -> float:
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
    except OSError:
        return 0.0
    return float(total)


def _inodes(path: str) -> tuple[float, float]:
    """(free, total) inodes of the filesystem holding ``path``; free as an
    unprivileged process sees it, as ``disk_free_bytes`` does for bytes."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0.0, 0.0
    return float(st.f_favail), float(st.f_files)


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


def _disk(path: str) -> _Usage:
    try:
        return _Usage(*shutil.disk_usage(path))
    except OSError:
        return _Usage(0, 0, 0)
