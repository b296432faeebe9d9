"""Archive series for ``/metrics`` (``durable_streams_archive_*``), read from the archiver's
progress (or a replica cluster's follower's status) at scrape time, as the replication
series are (replication/replica_metrics.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stream_server.archive.progress import KINDS, ArchiveProgress

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

PREFIX = "durable_streams_archive"


class ArchiveCollector(Collector):
    def __init__(self, progress: ArchiveProgress, timeout: float) -> None:
        self.p = progress
        self.timeout = timeout  # --archive-timeout: the lag alert compares with it

    def collect(self) -> Iterator[Metric]:
        p = self.p

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc)
            g.add_metric([], value)
            return g

        yield gauge(
            "archiving", "1 while this server uploads WAL to the archive", p.role == "archiving"
        )
        yield gauge(
            "timeout_seconds", "--archive-timeout: the recovery point objective", self.timeout
        )
        yield gauge("archived_lsn", "The last WAL frame the archive holds", p.archived_lsn)
        yield gauge("archived_term", "The term of the last archived frame", p.archived_term)
        yield gauge("lag_frames", "WAL frames durable here, not yet archived", p.lag_frames)
        yield gauge("lag_bytes", "Bytes of local WAL not yet archived", p.lag_bytes)
        yield gauge("lag_seconds", "Age of the oldest frame not yet archived", p.lag_seconds)
        yield gauge(
            "pending_bytes",
            "Bytes of local WAL kept for the archive (the pending bound's measure)",
            p.pending_bytes,
        )
        yield gauge("failing", "1 while the last attempt to archive failed", p.failing)
        yield gauge(
            "last_archived_timestamp_seconds",
            "When the last upload finished (Unix time; 0: none yet)",
            p.last_archived_at or 0,
        )
        yield gauge(
            "last_backup_timestamp_seconds",
            "When the archive's newest base backup was taken (Unix time; 0: none)",
            p.last_backup_at or 0,
        )
        uploads = CounterMetricFamily(f"{PREFIX}_uploads", "Frames objects uploaded")
        uploads.add_metric([], p.uploads)
        yield uploads
        sent = CounterMetricFamily(f"{PREFIX}_uploaded_bytes", "WAL frame bytes uploaded")
        sent.add_metric([], p.uploaded_bytes)
        yield sent
        failures = CounterMetricFamily(
            f"{PREFIX}_failures", "Failed archive attempts by kind", labels=["kind"]
        )
        for kind in KINDS:
            failures.add_metric([kind], p.failures[kind])
        yield failures


class FollowerCollector(Collector):
    """A replica cluster's server's series (``--archive-follow``): it archives nothing,
    so the archiver's series would only say "not archiving"; these say how far it
    follows, how far behind, and whether it is stuck (what the "replica cluster stuck"
    alert reads)."""

    def __init__(self, status: Callable[[], dict[str, object]], timeout: float) -> None:
        self.status = status  # ArchiveFollower.status
        self.timeout = timeout

    def collect(self) -> Iterator[Metric]:
        st = self.status()

        def gauge(name: str, doc: str, value: object) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc)
            g.add_metric([], float(value))  # type: ignore[arg-type]
            return g

        yield gauge("following", "1: this server follows another cluster's archive", 1)
        yield gauge(
            "timeout_seconds",
            "--archive-timeout: it lists the archive every half of it",
            self.timeout,
        )
        yield gauge("follow_applied_lsn", "The last archived frame applied here", st["applied_lsn"])
        yield gauge(
            "follow_lag_seconds",
            "Age of the oldest archived frame not applied here (from the last round caught "
            "up while it cannot apply)",
            st["lag_seconds"],
        )
        yield gauge("follow_failing", "1 while it cannot apply the archive's frames", st["failing"])
