"""Recovery in the background, behind a socket that is already open.

Recovery (WAL replay, every segment file's tail checked, the stream table
loaded) takes from milliseconds to minutes, with the number of streams and
the size of the WAL. Run before the socket opened, nothing answered
meanwhile: a kubelet could not tell a pod that recovers from one that hangs,
``/readyz``'s "recovery not finished" was never seen, and a pod killed for
its memory limit mid-way left no trace but a restart count.

So the server opens its socket first and runs recovery as a task: while it
runs, ``/healthz`` says the process is alive, ``/readyz`` answers 503 with
the progress, stream requests get 503 with ``Retry-After``, ``/metrics``
shows ``durable_streams_recovering 1`` and the progress, and a log line every
few seconds gives the progress with the process's resident memory. A pod
OOM-killed during recovery shows as progress lines that stop at a growing
RSS, then another "recovery started".

And the next start says so itself: a marker file in the data directory
(``.recovery-attempts``, the number of starts that began this recovery)
exists from recovery's start to its end, so a start that finds it knows
that many earlier starts were killed during recovery. It logs a warning and
exports the count (``durable_streams_recovery_interrupted``), which an alert
watches. The marker is never flushed: a process kill (what an OOM kill is)
keeps it in the page cache; a power cut may lose it, and with it only this
hint.

A recovery that fails (a WAL file it cannot replay, say) stops the server:
``on_failure`` is the server's way to be told.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

from stream_server.engine import RecoveryProgress, RecoveryReport
from stream_server.streams.store import StreamStore

log = logging.getLogger("stream_server")

MARKER = ".recovery-attempts"
LOG_EVERY = 5.0  # seconds between progress lines while recovery runs
RETRY_AFTER = 5  # seconds, for stream requests that arrive during recovery


def process_started() -> float | None:
    """When this process started, on ``time.monotonic``'s clock (the kernel's start
    time, /proc/self/stat's 22nd field, in clock ticks since boot); None where
    unknown. A pod is not ready for the imports and the settings either."""
    with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # the 22nd field; the first after ")" is the 3rd
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - age
    return None


def rss_bytes() -> int:
    """This process's resident set size now (VmRSS); its peak where /proc is missing."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class BackgroundRecovery:
    """The store's start (recovery) as a task, with what probes, metrics and logs need."""

    def __init__(
        self,
        store: StreamStore,
        *,
        on_failure: Callable[[BaseException], None] | None = None,
        log_every: float = LOG_EVERY,
        serving: str = "",
        opened: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        # Run once the engine is open, before anything is written (``StreamStore.start``).
        self.opened = opened
        self.serving = serving  # where streams are served from, for the last log line
        self.progress: RecoveryProgress = store.engine.progress
        self.on_failure = on_failure
        self.log_every = log_every
        self.report: RecoveryReport | None = None
        self.marker = Path(store.engine.layout.root) / MARKER
        # Earlier starts killed while running this same recovery (an OOM kill, say).
        self.interrupted = 0
        # Recovery succeeded and the store serves streams. An attribute, not a
        # property: every stream request reads it.
        self.finished = False
        self.error: BaseException | None = None
        self._started = 0.0
        self._ready_at = 0.0  # when the store began to serve streams
        # The server process sets it (server.py): a process that hosts the app among
        # other things (tests) keeps its collector as it is.
        self.freeze_gc = False
        self._process_started = process_started()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self.finished and self.error is None

    def seconds(self) -> float:
        """How long the recovery took, or has been running: the engine's recovery and
        the streams made servable after it (``StreamStore.load_seconds``), all of the
        time the store did not serve streams."""
        if self._ready_at:
            return self._ready_at - self._started
        return time.monotonic() - self._started if self._started else 0.0

    def startup_seconds(self) -> float:
        """From the process's start (or the lifespan's, where that is unknown) to ready,
        or so far."""
        if not self._started:
            return 0.0
        began = self._process_started if self._process_started is not None else self._started
        return (self._ready_at or time.monotonic()) - began

    def status(self) -> dict[str, object]:
        """The progress, for ``/readyz``."""
        p = self.progress
        return {
            "phase": p.phase,
            "wal_frames_replayed": p.wal_frames,
            "streams_checked": p.streams_checked,
            "streams_total": p.streams_total,
            "seconds": round(self.seconds(), 3),
        }

    def start(self) -> None:
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._run(), name="recovery")

    async def stop(self) -> None:
        """Wait for a recovery still running (the server is stopping), then stop the store.

        Recovery runs on a thread that cannot be interrupted; a kill is as safe
        (the next start runs recovery again), but a clean stop waits for it.
        """
        if self._task is None:
            return
        if self.running:
            log.info("stopping during recovery: waiting for it to finish")
        with contextlib.suppress(Exception):
            await self._task
        if self.finished:
            await self.store.stop()

    async def recovered(self) -> bool:
        """Once the recovery started has ended: whether it succeeded (the store serves
        streams). An awaitable for what starts after it, instead of a polling loop."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
        return self.finished

    def _mark_start(self) -> None:
        """Count this start in the marker; the count found is the starts killed before."""
        try:
            self.interrupted = int(self.marker.read_text().strip() or 0)
        except FileNotFoundError:
            self.interrupted = 0
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s: %s", self.marker, exc)
        if self.interrupted:
            log.warning(
                "recovery was interrupted %d time(s): earlier starts were killed before it "
                "finished (out of memory? compare the memory limit with docs/kubernetes.md, Sizing)",
                self.interrupted,
                extra={"fields": {"event": "recovery_interrupted", "times": self.interrupted}},
            )
        with contextlib.suppress(OSError):  # a read-only directory fails later, and clearly
            self.marker.write_text(f"{self.interrupted + 1}\n")

    def _mark_end(self) -> None:
        with contextlib.suppress(OSError):
            self.marker.unlink(missing_ok=True)

    async def _run(self) -> None:
        await asyncio.to_thread(self._mark_start)
        log.info(
            "recovery started (RSS %.0f MiB)",
            rss_bytes() / 2**20,
            extra={"fields": {"event": "recovery_started", "rss_bytes": rss_bytes()}},
        )
        ticker = asyncio.create_task(self._log_progress())
        try:
            report = await self.store.start(opened=self.opened)
        except Exception as exc:
            self.error = exc
            self._mark_end()  # not killed: this start ended, with its reason in the log
            log.error("recovery failed, stopping: %s", exc)
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        finally:
            ticker.cancel()
        if self.freeze_gc:
            # What the start built (a tail per stream: a million objects) lives as long
            # as the server: out of the collector's reach, so that no full collection
            # walks it while appends wait on the event loop (e2e/bench/gc_pauses.py).
            gc.freeze()
        self._ready_at = time.monotonic()
        self._mark_end()
        self.report = report
        self.finished = True
        self._log_report(report)

    async def _log_progress(self) -> None:
        while True:
            await asyncio.sleep(self.log_every)
            p, rss = self.progress, rss_bytes()
            log.info(
                "recovering for %.0fs: %s, %d WAL frames replayed, %d of %d streams checked, "
                "RSS %.0f MiB",
                self.seconds(),
                p.phase,
                p.wal_frames,
                p.streams_checked,
                p.streams_total,
                rss / 2**20,
                extra={"fields": {"event": "recovery_progress", **self.status(), "rss_bytes": rss}},
            )

    def _log_report(self, report: RecoveryReport) -> None:
        log.info(
            "recovery finished in %.3fs (the engine's %.3fs, then %.3fs loading the streams), "
            "ready %.3fs after the process started: %d streams, %d WAL frames replayed, "
            "%d streams trimmed (%d bytes), %d damaged, %d orphan files removed (RSS %.0f MiB)",
            self.seconds(),
            report.seconds,
            self.store.load_seconds,
            self.startup_seconds(),
            report.streams,
            report.wal_frames_replayed,
            report.truncated_streams,
            report.truncated_bytes,
            len(report.damaged),
            report.orphan_files_removed,
            rss_bytes() / 2**20,
        )
        for sid, reason in report.damaged.items():
            log.error("stream id %d is damaged and will not be served: %s", sid, reason)
        log.info(
            "serving streams %s",
            self.serving,
            extra={
                "fields": {
                    "event": "recovery",
                    "seconds": self.seconds(),
                    "engine_seconds": report.seconds,
                    "load_seconds": self.store.load_seconds,
                    "startup_seconds": self.startup_seconds(),
                    "streams": report.streams,
                    "wal_frames": report.wal_frames_replayed,
                    "trimmed_streams": report.truncated_streams,
                    "damaged": len(report.damaged),
                    "rss_bytes": rss_bytes(),
                }
            },
        )
