"""Replication series for ``/metrics``, read from the live state at scrape time.

Role and term, the in-sync count, and per standby (on the primary) the lag in
frames, bytes and seconds: seconds since the standby last held everything the
primary did, Kafka's measure for ``replica.lag.time.max.ms``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stream_server.replication.lease import boottime

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from stream_server.replication.replica_set import Replication

PREFIX = "durable_streams_replication"


class ReplicationCollector(Collector):
    def __init__(self, replication: Replication) -> None:
        self.r = replication

    def collect(self) -> Iterator[Metric]:
        r = self.r
        shipper = r.shipper
        primary = r.primary_mode

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc)
            g.add_metric([], value)
            return g

        yield gauge("primary", "1 on the primary of the replica set, 0 on a standby", primary)
        yield gauge("term", "The Lease term this replica last saw", r.roles.state.term)
        yield gauge(
            "in_sync_replicas",
            "Replicas holding every acknowledged write, the primary included (primary only)",
            1 + len(r.roles.state.in_sync) if primary else 0,
        )
        yield gauge(
            "min_in_sync_replicas",
            "Replicas that must hold a batch before it is acknowledged",
            r.quorum,
        )
        yield gauge("degraded", "1 when fewer than min-in-sync replicas are in sync", r.degraded)
        yield gauge("durable_lsn", "The last batch durable on this replica", r.hooks.durable[1])
        yield gauge(
            "read_fresh",
            "1 while this replica answers reads (current within the read staleness bound), "
            "0 while it refuses them with 503",
            r.read_fence.fresh_for() > 0,
        )
        shipped = CounterMetricFamily(f"{PREFIX}_frames_shipped", "WAL frames sent to standbys")
        shipped.add_metric([], shipper.shipped)
        yield shipped
        failovers = CounterMetricFamily(
            f"{PREFIX}_failovers", "Times this replica became the primary"
        )
        failovers.add_metric([], r.failovers)
        yield failovers
        frames = GaugeMetricFamily(
            f"{PREFIX}_lag_frames", "Batches the standby lacks (primary only)", labels=["standby"]
        )
        size = GaugeMetricFamily(
            f"{PREFIX}_lag_bytes", "WAL bytes the standby lacks (primary only)", labels=["standby"]
        )
        seconds = GaugeMetricFamily(
            f"{PREFIX}_lag_seconds",
            "Seconds since the standby last held everything the primary did (primary only)",
            labels=["standby"],
        )
        if primary:
            now = boottime.now()  # the clock caught_up_at is read on
            mine = shipper.lsn
            for name, (_, lsn) in sorted(shipper.acked.items()):
                frames.add_metric([name], max(0, mine - lsn))
                size.add_metric([name], sum(len(f) for _, n, f in shipper.ring if n > lsn))
                behind = lsn < mine
                since = shipper.caught_up_at.get(name, now)
                seconds.add_metric([name], now - since if behind else 0.0)
        yield frames
        yield size
        yield seconds
