"""The continuous WAL archive: a thread that copies every published WAL frame into
the object store (docs/archive.md).

On the primary (and on a single node, term 0 with history ``[[0, 1]]``) it
finds where the archive ends along this replica's term history
(``archive_end.archived_end``), then reads the frames after that from the local
WAL (``wal_source.py``: the spool, then ``wal/``) up to the engine's published
lsn, and uploads them as frames objects: when a batch reaches
``archive_object_bytes``, when its oldest frame is ``archive_timeout`` old, at
a term's end, and at once in ``required`` mode (where the ack gate waits for
it, ``ack_gate.py``). Each term's history object goes first. Spooled WAL files
the archive holds are deleted. It is woken per committed batch (``notify``), at most
once per ``MIN_ROUND`` in async mode.

On a standby it uploads nothing: it polls the archive's end (every half
``archive_timeout``) and deletes the spooled files the archive holds, so that a
standby keeps what a failover would need its successor-to-be to archive.

Failures never stop the server's writes: ``ArchiveUnavailable`` (and local
read errors) retry with a capped exponential back-off, ``ArchiveDenied`` and
``ArchiveDamaged`` slowly (``DENIED_RETRY``): a condition a person must clear,
never a storm of requests. A per-batch wake-up does not cut a back-off short.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stream_format.archive import ArchiveDamaged, History, term_of
from stream_format.layout import Layout
from stream_server.archive.backup import catalog
from stream_server.archive.object_store import ArchiveDenied, ArchiveError, ObjectStore
from stream_server.archive.progress import ArchiveProgress
from stream_server.archive.upload import archive_end
from stream_server.archive.upload.uploads import Batch
from stream_server.archive.upload.wal_source import WalSource
from stream_server.declared.groups import ArchiveSettings
from stream_server.engine import fsio
from stream_server.engine.wal_keep import spool_dir

log = logging.getLogger("stream_server.archive")

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
DENIED_RETRY = 30.0  # seconds between attempts while the store refuses us
# Async mode: at most one round per this many seconds however many batches wake it
# (a round lists and reads the WAL; a commit time in an object is this late at most).
MIN_ROUND = 0.05
# Seconds between two looks at the archive's newest base backup (the metric the
# "last backup too old" alert reads): a listing of backups/, names only.
BACKUPS_EVERY = 300.0
HINT_FILE = "archived"  # in the spool: the last archived lsn, a hint (stale only keeps more)


class Archiver:
    def __init__(
        self,
        layout: Layout,
        store: ObjectStore,
        settings: ArchiveSettings,
        *,
        published: Callable[[], int],
        history: Callable[[], History],
        base: Callable[[], int] = lambda: 0,
    ) -> None:
        """``base``: the last lsn this archive is not to hold (0; after a promotion the
        last frame the directory applied from the archive it followed, which holds
        them: this archive begins after it, ``follow_position.promote``)."""
        self.layout = layout
        self.store = store
        self.settings = settings
        self.published = published  # the engine's published lsn
        self.history = history  # this replica's term history, oldest first
        self.base = base
        # A gap's message (frames no local file holds): it stays the status's last_error,
        # through successes, until a base backup taken here covers it.
        self._gap_error: str | None = None
        self.progress = ArchiveProgress(store.url, settings.archive_mode)
        self.progress.published = published
        self.progress.archived_lsn = self._read_hint()
        # Told (on the archiver's thread) each time the archived lsn moves: the ack gate.
        self.on_progress: Callable[[int], None] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._switch = threading.Lock()
        self._draining = threading.Event()
        self._backups_seen = 0.0  # time.monotonic() of the last look (0: look now)

    # ------------------------------------------------------------ the engine's hook

    def floor(self) -> int:
        """The archived lsn: WAL holding frames above it is kept (engine/wal_keep.py)."""
        return self.progress.archived_lsn

    def behind(self) -> bool:
        """Beyond the pending bound: new writes are refused until the archive catches up."""
        return self.progress.pending_bytes > self.settings.archive_max_pending_bytes

    def backup_taken(self) -> None:
        """A base backup finished here: look at the backups again in the next round. A
        gap named before it is covered: restores start from this backup or later."""
        self._backups_seen = 0.0
        self._gap_error = None
        self._wake.set()

    def notify(self) -> None:
        """A batch was committed (the store's batch hook, on the event loop)."""
        self._wake.set()

    # ------------------------------------------------------------ the thread

    def start(self, role: str, *, unless_started: bool = False) -> None:
        """Run as ``archiving`` (the primary, a single node) or ``standby``; the thread
        of the previous role is told to stop (its upload in flight may still finish:
        conditional puts make two archivers safe). ``unless_started``: only if no role
        runs yet (a replica's first start, which the role switch may have beaten)."""
        with self._switch:
            if unless_started and self._thread is not None:
                return
            self.stop(wait=1.0)
            self._stop = stop = threading.Event()
            self.progress.role = role
            target = self._archive if role == "archiving" else self._standby
            self._thread = threading.Thread(
                target=self._run, args=(target, stop), name=f"archive-{role}", daemon=True
            )
            self._thread.start()

    def drain(self, within: float) -> None:
        """A clean shutdown: upload every published frame now, due or not, waiting up to
        ``within`` seconds (a store that fails is not retried: the spool keeps the
        frames for the next start), then stop."""
        if self.progress.role == "archiving" and self._thread is not None:
            self._draining.set()
            self._wake.set()
            self._thread.join(within)
        self.stop()

    def stop(self, wait: float = 0.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and wait:
            self._thread.join(wait)

    def _run(self, step: Callable[[_Run], float], stop: threading.Event) -> None:
        backoff = FIRST_BACKOFF
        run: _Run | None = None
        while not stop.is_set():
            try:
                if run is None:
                    run = self._begin(stop)
                pause = step(run)
                self._housekeep(run)
                self._succeeded()
                backoff = FIRST_BACKOFF
                if self._draining.is_set() and self.progress.lag_frames == 0:
                    return
                if self.settings.archive_mode != "required":
                    stop.wait(MIN_ROUND)
                self._wake.wait(pause)
                self._wake.clear()
                continue
            except ArchiveDenied as exc:
                self._failed("denied", exc)
                pause = DENIED_RETRY
            except ArchiveDamaged as exc:
                self._failed("damaged", exc)
                pause = DENIED_RETRY
            except (ArchiveError, OSError) as exc:
                self._failed("unavailable", exc)
                pause, backoff = backoff, min(backoff * 2, MAX_BACKOFF)
            except Exception as exc:  # a bug must not end the archive silently
                log.exception("archiver failed")
                self._failed("unavailable", exc)
                pause, backoff = backoff, min(backoff * 2, MAX_BACKOFF)
            # The lag still grows: the pending bound must see it (before the archive's
            # end is known, every local WAL byte counts).
            with contextlib.suppress(OSError):
                self._measure(run or self._unbegun(stop))
            if self._draining.is_set():
                return
            stop.wait(pause)  # only a stop cuts a back-off short

    def _begin(self, stop: threading.Event) -> _Run:
        """Where the archive ends along our history, and a WAL reader from there.

        The archived lsn is set, not raised: after a failover it may be lower than
        what this replica saw as a standby. The hint counts only when the archive
        holds nothing of our history (a retention deleted every object): where it
        holds something, a hint from before a failover may name frames of a
        history we left."""
        history = self.history()
        lsn, term = archive_end.archived_end(self.store, history)
        published = self.published()
        if lsn == 0:
            lsn = min(self._read_hint(), published)
        if lsn > published and self.progress.role == "archiving":
            raise ArchiveDamaged(
                f"the archive holds lsn {lsn} of this history, beyond this data directory's "
                f"{published}: another server's archive, or an older copy of this data; "
                "archive to a new location (or restore from this one)"
            )
        base = self.base()
        if lsn < base:  # a promoted directory's frames up to base are in the followed archive
            lsn, term = base, term_of(history, base)
        self._archived(lsn, term, reset=True)
        return _Run(WalSource(self.layout, lsn), Batch(self.settings), stop)  # from the end

    def _unbegun(self, stop: threading.Event) -> _Run:
        return _Run(WalSource(self.layout, self.progress.archived_lsn), Batch(self.settings), stop)

    def _archive(self, run: _Run) -> float:
        """One round on the primary; the seconds until the next is due."""
        published = self.published()
        batch = run.batch
        room = self.settings.archive_object_bytes - batch.size
        history = self.history()
        if room > 0:
            reads = run.source.read(published, room)
            # A gap at or below the history's first lsn is no gap: a set begun on
            # single-node data has no frame at its base (``engine.replica.stamp_base``).
            gap = (self.progress.archived_lsn + 1, reads[0].frame.lsn - 1) if reads else (1, 0)
            if not batch.reads and gap[1] >= gap[0] and gap[1] > history[0][1]:
                self._gap(*gap)
            batch.add(reads, self.progress.archived_lsn, history)
        hurry = self._draining.is_set()
        while not run.stop.is_set() and (group := batch.due(hurry)) is not None:
            term, frames = group
            if term not in run.histories:
                archive_end.put_history(self.store, history, term)
                run.histories.add(term)
            held = archive_end.put_frames(self.store, term, [r.frame for r in frames])
            held = min(held, archive_end.term_end(history, term))
            self.progress.uploads += 1
            self.progress.uploaded_bytes += sum(len(r.frame.frame) for r in frames)
            self.progress.last_archived_at = time.time()
            run.position = max(run.position, batch.position_of(held) or run.position)
            batch.drop(held)
            self._archived(held, term)
        self.progress.oldest_unarchived = batch.oldest()
        return batch.wait()

    def _standby(self, run: _Run) -> float:
        """One round on a standby: the archive's end, polled (no further than this
        standby's own frames: beyond them the archive holds what it lacks, a deposed
        primary's frames maybe)."""
        lsn, term = archive_end.archived_end(self.store, self.history())
        self._archived(min(lsn, self.published()), term)
        run.source.after = max(run.source.after, self.progress.archived_lsn)
        run.source.read(self.progress.archived_lsn, self.settings.archive_object_bytes)
        return max(self.settings.archive_timeout / 2, 0.1)

    # ------------------------------------------------------------ bookkeeping

    def _archived(self, lsn: int, term: int, *, reset: bool = False) -> None:
        moved = lsn > self.progress.archived_lsn or (reset and lsn != self.progress.archived_lsn)
        self.progress.archived_lsn = lsn if reset else max(self.progress.archived_lsn, lsn)
        self.progress.archived_term = term
        if moved:
            self._write_hint(self.progress.archived_lsn)
            if self.on_progress is not None:
                self.on_progress(self.progress.archived_lsn)

    def _housekeep(self, run: _Run) -> None:
        """Spooled files the archive holds deleted; the lag measured."""
        archived = self.progress.archived_lsn
        spool = spool_dir(self.layout)
        gone = False
        for number, last in list(run.source.finished.items()):
            if last > archived:
                continue
            spooled = spool / f"{number:016d}.wal"
            if spooled.exists():
                fsio.unlink(spooled)
                gone = True
            if not (self.layout.wal / spooled.name).exists():
                del run.source.finished[number]
        if gone:
            fsio.fsync_dir(spool)
        self._measure(run)
        now = time.monotonic()
        if not self._backups_seen or now - self._backups_seen >= BACKUPS_EVERY:
            self.progress.last_backup_at = catalog.newest_backup_time(self.store)
            self._backups_seen = now

    def _measure(self, run: _Run) -> None:
        """Bytes of local WAL above the archived frame (lag), and those plus the spooled
        files not yet deleted (pending: what the archive keeps on this disk)."""
        number, end = max(run.position, run.source.passed)
        lag = spooled = 0
        for n, path in run.source.files():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            above = 0 if n < number else size - end if n == number else size
            lag += max(above, 0)
            if path.parent != self.layout.wal:
                spooled += size - max(above, 0)
        self.progress.lag_bytes = lag
        self.progress.pending_bytes = lag + spooled

    def _gap(self, first: int, last: int) -> None:
        """Frames no local file holds any more (written while the archive was off, or a
        spool removed by hand): the archive gets a gap a restore will name. Said loudly;
        archiving goes on (a new base backup covers what is missing)."""
        message = (
            f"frames {first}..{last} are in no local WAL file and not in the archive: take a "
            "new base backup (was the server run without --archive-url?)"
        )
        log.error("archive to %s: %s", self.store.url, message)
        self.progress.last_error = self._gap_error = message

    def _succeeded(self) -> None:
        """A round went through: a failure's error is cleared (the status's last_error
        names what is wrong now, not what was); a gap's stays until a backup covers it."""
        if self.progress.failing:
            log.info("archive to %s works again", self.store.url)
        self.progress.failing = False
        self.progress.last_error = self._gap_error
        self.progress.last_error_kind = None

    def _failed(self, kind: str, exc: BaseException) -> None:
        self.progress.failures[kind] += 1
        if not self.progress.failing or self.progress.last_error_kind != kind:
            log.warning("archive to %s failing (%s): %s", self.store.url, kind, exc)
        self.progress.failing = True
        self.progress.last_error = str(exc)
        self.progress.last_error_kind = kind

    def _read_hint(self) -> int:
        try:
            return int((spool_dir(self.layout) / HINT_FILE).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _write_hint(self, lsn: int) -> None:
        """Not flushed: a stale hint only keeps more WAL."""
        spool = spool_dir(self.layout)
        try:
            spool.mkdir(exist_ok=True)
            (spool / HINT_FILE).write_text(f"{lsn}\n")
        except OSError as exc:
            log.warning("could not write %s: %s", spool / HINT_FILE, exc)


@dataclass
class _Run:
    """One role's state: its WAL reader, its batch, the histories it wrote, the file
    position just past the last frame archived."""

    source: WalSource
    batch: Batch
    stop: threading.Event
    position: tuple[int, int] = (0, 0)
    histories: set[int] = field(default_factory=set)
