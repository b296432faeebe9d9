"""The replicated workload (issue 13): a 3-replica set against single-node ours, same run.

The replica set is ``testkit.replicaset`` (the emulated Kubernetes API with
its Lease, and three ``stream_server`` processes on this machine, each with
its own data directory), as the replication tests start it, with the default
lease settings and durability (``required``: a write is acknowledged once the
primary and every in-sync standby hold it durably). The workloads see it as
one server, the primary, once both standbys are in the in-sync set.

Each side (single-node ours, then the set) runs the 64 x 64 append workload
and the sequential one, exactly as the single-server table does. On the set,
while the appends run, a thread reads the primary's ``/metrics`` every
``LAG_EVERY`` seconds for each standby's ``lag_bytes`` and ``lag_seconds``;
afterwards the harness times how long the standbys take to hold everything
(``catch_up_s``) and reads every stream back from every replica: each must
be byte for byte the primary's, which holds at least every acknowledged
append (``identical`` counts the replicas that pass, the primary included).
"""

from __future__ import annotations

import hashlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.client import Conn
from bench.results import Profile, ReplicationResult
from bench.sampler import Sampler
from bench.servers import LONG_POLL_SECONDS, Server
from bench.sides import run_sides
from bench.workloads import appends, sequential
from testkit.replicaset import Replica, ReplicaSet, runs
from testkit.servers import rss_bytes

REPLICAS = 3
LAG_EVERY = 0.25  # seconds between two samples of the primary's lag metrics
SIDES = ("single", "replicated")


class ReplicaSetServer(Server):
    """A replica set seen as one server: the primary's port, once every standby is in sync."""

    def __init__(self, workdir: Path, replicas: int = REPLICAS) -> None:
        super().__init__("replicated", workdir)
        self.replicas = replicas
        self.rs: ReplicaSet | None = None
        self.primary: Replica | None = None

    def start(self, data_dir: Path | None = None, timeout: float = 120) -> float:
        """Start the API server and the set; seconds until the primary has every standby
        in its in-sync set (before that, acknowledgements would wait for fewer)."""
        started = time.monotonic()
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="replicaset-", dir=self.workdir))
        self.rs = ReplicaSet.up(
            self.replicas,
            self.data_dir,
            settings={"log_level": "warning"},
            args=("--host", "127.0.0.1", "--long-poll-timeout", str(LONG_POLL_SECONDS)),
        )
        if not self.rs.replication:
            raise RuntimeError("this server has no replication settings (--replication-lease)")
        deadline = started + timeout
        while True:
            self.primary = self.rs.primary(timeout=max(1.0, deadline - time.monotonic()))
            st = self.rs.status(self.primary.name) or {}
            if st.get("role") == "primary" and len(st.get("in_sync", [])) == self.replicas - 1:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"standbys not in sync after {timeout} s: {st}")
            time.sleep(0.1)
        self.port = self.primary.port
        return time.monotonic() - started

    @property
    def running(self) -> bool:
        return self.rs is not None and all(runs(s.pid, s.command) for s in self.rs.servers)

    def pids(self) -> list[int]:
        if self.rs is None or self.primary is None:
            return []
        others = [s.pid for s in self.rs.servers if s.name != self.primary.name]
        return [self.primary.pid, *others]

    def log_tail(self) -> str:
        if self.primary is None:
            return ""
        return Path(self.primary.log).read_text(errors="replace")[-3000:]

    def rss(self) -> int:
        return rss_bytes(self.primary.pid) if self.primary else 0

    def stop(self) -> None:
        if self.rs is not None:
            self.rs.down()

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# ------------------------------------------------------------------ lag


class LagSampler(Sampler):
    """Reads the primary's per-standby lag metrics every ``LAG_EVERY`` s during the load."""

    def __init__(self, url: str) -> None:
        super().__init__(LAG_EVERY, "lag sampler")
        self.url = url
        self.bytes: list[float] = []  # the worst standby's lag, one value per sample
        self.seconds: list[float] = []
        self.frames: list[float] = []

    def sample(self, http: httpx.Client) -> None:
        worst = lag_metrics(http.get(f"{self.url}/metrics").text)
        if worst:
            self.bytes.append(worst.get("lag_bytes", 0.0))
            self.seconds.append(worst.get("lag_seconds", 0.0))
            self.frames.append(worst.get("lag_frames", 0.0))


def lag_metrics(text: str) -> dict[str, float]:
    """The largest value over the standbys of each ``durable_streams_replication_lag_*``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix("durable_streams_replication_")
        if name in ("lag_bytes", "lag_seconds", "lag_frames"):
            for sample in family.samples:
                out[name] = max(out.get(name, 0.0), float(sample.value))
    return out


def caught_up(rs: ReplicaSet, primary: Replica, timeout: float = 120) -> float:
    """Seconds until every standby holds, and may serve, all the primary holds now."""
    started = time.monotonic()
    target = (rs.status(primary.name) or {})["durable"]["lsn"]
    while True:
        views = [rs.status(s.name) or {} for s in rs.servers if s.name != primary.name]
        if all(
            v.get("durable", {}).get("lsn", -1) >= target and v.get("committed", -1) >= target
            for v in views
        ):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"standbys not caught up to lsn {target} after {timeout} s: {views}")
        time.sleep(0.02)


def digest(port: int, names: list[str]) -> tuple[str, int]:
    """sha256 over every stream's bytes (read from -1 until up to date), and their count."""
    h = hashlib.sha256()
    total = 0
    c = Conn(port)
    try:
        for name in names:
            h.update(name.encode() + b"\0")
            offset = "-1"
            while True:
                status, headers, body = c.request("GET", f"/v1/stream/{name}?offset={offset}")
                if status != 200:
                    raise RuntimeError(f"GET {name} on port {port}: {status}")
                h.update(body)
                total += len(body)
                offset = headers["stream-next-offset"]
                if headers.get("stream-up-to-date") == "true":
                    break
    finally:
        c.close()
    return h.hexdigest(), total


# ------------------------------------------------------------ one side


def measure(srv: Server, prof: Profile) -> ReplicationResult:
    """The 64 x 64 appends, then the sequential appends; on a replica set also the
    standbys' lag during the appends, their catch-up, and every replica's content."""
    rs = srv.rs if isinstance(srv, ReplicaSetServer) else None
    primary = srv.primary if isinstance(srv, ReplicaSetServer) else None
    lag: LagSampler | None = None
    if primary is not None:
        with LagSampler(primary.url) as lag:
            a = appends(srv, prof, streams=64, threads=64)
    else:
        a = appends(srv, prof, streams=64, threads=64)
    catch_up = caught_up(rs, primary) if rs and primary else None
    s = sequential(srv, prof)
    identical = None
    data_bytes = None
    if rs and primary:
        caught_up(rs, primary)
        names = [f"a64-{i}" for i in range(64)] + ["seq-0"]
        mine, data_bytes = digest(primary.port, names)
        identical = sum(1 for r in rs.servers if digest(r.port, names)[0] == mine)
    return ReplicationResult(
        replicas=REPLICAS if rs else 1,
        appends_per_s=a.appends_per_s,
        p50_ms=a.p50_ms,
        p99_ms=a.p99_ms,
        errors=a.errors,
        acknowledged=a.acknowledged,
        held=a.held,
        cpu_ms=sum(a.cpu_ms) if a.cpu_ms else None,
        cpu_ms_primary=a.cpu_ms[0] if a.cpu_ms else None,
        cpu_ms_standby=statistics.mean(a.cpu_ms[1:]) if len(a.cpu_ms) > 1 else None,
        seq_p50_ms=s.p50_ms,
        seq_p99_ms=s.p99_ms,
        seq_appends_per_s=s.appends_per_s,
        seq_errors=s.errors,
        seq_cpu_ms=sum(s.cpu_ms) if s.cpu_ms else None,
        seq_cpu_ms_primary=s.cpu_ms[0] if s.cpu_ms else None,
        seq_cpu_ms_standby=statistics.mean(s.cpu_ms[1:]) if len(s.cpu_ms) > 1 else None,
        lag_bytes_p50=_median(lag.bytes) if lag else None,
        lag_bytes_max=max(lag.bytes, default=None) if lag else None,
        lag_seconds_p50=_median(lag.seconds) if lag else None,
        lag_seconds_max=max(lag.seconds, default=None) if lag else None,
        lag_frames_max=max(lag.frames, default=None) if lag else None,
        lag_samples=len(lag.bytes) if lag else None,
        catch_up_s=catch_up,
        identical=identical,
        data_bytes=data_bytes,
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_replicated(
    prof: Profile, workdir: Path, repeat: int
) -> tuple[dict[str, ReplicationResult], dict[str, str]]:
    """Single-node ours, then the replica set, ``repeat`` times; medians of each side,
    and the errors by "replicated/<side>"."""

    def server(side: str) -> Server:
        return ReplicaSetServer(workdir) if side == "replicated" else Server("ours", workdir)

    def run(side: str, srv: Server) -> ReplicationResult:
        srv.start()
        return measure(srv, prof)

    def describe(res: ReplicationResult) -> str:
        return f"{res.appends_per_s:,.0f} appends/s, seq p50 {res.seq_p50_ms:.2f} ms"

    return run_sides("replicated", SIDES, repeat, workdir, server, run, describe)
