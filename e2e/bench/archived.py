"""The archived workload (issue 27): ours with the object-store archive on against off,
same run, alternating.

The archive is a real SeaweedFS (``testkit.seaweedfs``, ``weed mini`` on loopback)
started once for the workload; each archived side gets a bucket of its own and the
default archive settings (``async`` mode, 10 s timeout, 16 MiB objects). Each side
runs the 64 x 64 append workload and the sequential one, exactly as the main table
does. On the archived side a thread reads ``GET /_archive/status`` every
``LAG_EVERY`` seconds during the 64 x 64 appends for the archive's lag (seconds
behind the newest durable frame: p50 and p99 over the samples); afterwards the
harness times how long the archive takes to hold every frame (``catch_up_s``) and
checks it does (``archived_all``: the archive's last lsn equals the server's).
The cost the issue names is the ratio of the two sides' appends/s (under 10%).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx

from bench.results import ArchiveResult, Profile
from bench.sampler import Sampler
from bench.servers import Server
from bench.sides import run_sides
from bench.workloads import appends, sequential
from testkit.seaweedfs import SeaweedFS

LAG_EVERY = 0.25  # seconds between two samples of the archive's status
SIDES = ("off", "on")


class LagSampler(Sampler):
    """Reads ``/_archive/status`` every ``LAG_EVERY`` s during the load."""

    def __init__(self, port: int) -> None:
        super().__init__(LAG_EVERY, "archive lag")
        self.url = f"http://127.0.0.1:{port}/_archive/status"
        self.seconds: list[float] = []
        self.bytes: list[float] = []

    def sample(self, http: httpx.Client) -> None:
        st = http.get(self.url).json()
        self.seconds.append(float(st.get("lag_seconds", 0.0)))
        self.bytes.append(float(st.get("lag_bytes", 0.0)))


def archive_status(http: httpx.Client, port: int) -> dict[str, object]:
    answer = http.get(f"http://127.0.0.1:{port}/_archive/status")
    answer.raise_for_status()
    doc: dict[str, object] = answer.json()
    return doc


def caught_up(http: httpx.Client, port: int, timeout: float = 120) -> float:
    """Seconds until the archive holds every frame the server has made durable.

    One client for all the polls: a new one each time (``httpx.get``) loads the CA
    bundle for its TLS context, 60 ms of CPU per poll, most of the harness's CPU while
    the archive catches up."""
    started = time.monotonic()
    while True:
        st = archive_status(http, port)
        durable, archived = st.get("durable_lsn"), st.get("archived_lsn")
        if isinstance(durable, int) and isinstance(archived, int) and archived >= durable:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"the archive did not catch up in {timeout} s: {st}")
        time.sleep(0.05)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(srv: Server, prof: Profile, archived: bool) -> ArchiveResult:
    lag: LagSampler | None = None
    if archived:
        with LagSampler(srv.port) as lag:
            a = appends(srv, prof, streams=64, threads=64)
    else:
        a = appends(srv, prof, streams=64, threads=64)
    with httpx.Client(timeout=5) as http:
        catch_up = caught_up(http, srv.port) if archived else None
        s = sequential(srv, prof)
        archived_all = None
        if archived:
            caught_up(http, srv.port)
            st = archive_status(http, srv.port)
            archived_all = st.get("archived_lsn") == st.get("durable_lsn")
    return ArchiveResult(
        appends_per_s=a.appends_per_s,
        p50_ms=a.p50_ms,
        p99_ms=a.p99_ms,
        errors=a.errors,
        cpu_ms=sum(a.cpu_ms) if a.cpu_ms else None,
        seq_p50_ms=s.p50_ms,
        seq_p99_ms=s.p99_ms,
        seq_appends_per_s=s.appends_per_s,
        seq_errors=s.errors,
        lag_seconds_p50=_percentile(lag.seconds, 0.5) if lag else None,
        lag_seconds_p99=_percentile(lag.seconds, 0.99) if lag else None,
        lag_bytes_max=max(lag.bytes, default=None) if lag else None,
        lag_samples=len(lag.seconds) if lag else None,
        catch_up_s=catch_up,
        archived_all=archived_all,
    )


def run_archived(
    prof: Profile, workdir: Path, repeat: int
) -> tuple[dict[str, ArchiveResult], dict[str, str]]:
    """Ours without, then with the archive, ``repeat`` times; medians of each side, and
    the errors by "archived/<side>"."""
    store = SeaweedFS(workdir / "seaweedfs")
    try:
        store.start()
    except Exception as exc:
        store.close()
        return {}, {"archived/store": f"{type(exc).__name__}: {exc}"}

    def server(side: str) -> Server:
        srv = Server("ours", workdir)
        if side == "on":
            srv.extra_args = [
                "--archive-url",
                store.new_bucket() + "/bench",
                "--archive-endpoint",
                store.endpoint,
            ]
            srv.extra_env = {k: v for k, v in store.env().items() if k.startswith("AWS_")}
        return srv

    def run(side: str, srv: Server) -> ArchiveResult:
        srv.start()
        return measure(srv, prof, archived=side == "on")

    try:
        return run_sides(
            "archived",
            SIDES,
            repeat,
            workdir,
            server,
            run,
            lambda res: f"{res.appends_per_s:,.0f} appends/s",
        )
    finally:
        store.close()


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
