"""A replica cluster's server (``--archive-follow``): it follows another cluster's
archive read-only (docs/replica-clusters.md; CloudNativePG's replica clusters, a
PostgreSQL standby fed by ``restore_command`` alone).

It archives nothing and writes nothing of its own: its engine refuses batches
(a standby's ``ReplicaHooks``), the app answers every write 503 ``read-only
replica cluster``, and the store's sweepers and the subscriptions' deliveries
stay paused. Every ``--archive-timeout``/2 it lists the archive's term
histories and the frames objects after the last one it read, downloads the
new ones (each checked: ``stream_format.archive.decode_frames_object``) and
applies their frames through the standby's path (``engine.replica.write_frames``
and ``commit_frames``: segment files, the WAL, fdatasync, LMDB), then shows
them to readers through the same ``Mirror`` a standby uses, which wakes
long-polls and SSE readers. Frames are taken along the newest term's history
(``follow_plan.py``), so after a failover at the source the new term's frames
are taken from its first lsn.

How far it got is recorded with the frames' own metadata (``follow_position.py``),
so a restart continues where it stopped. ``status()`` is what ``GET
/_archive/status`` shows of it (role ``following``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from stream_format import wal as walmod
from stream_format.archive import (
    HISTORY_PREFIX,
    WAL_PREFIX,
    ArchiveDamaged,
    ArchivedFrame,
    History,
    decode_frames_object,
    decode_history,
)
from stream_server.archive.archive_metrics import FollowerCollector
from stream_server.archive.follow.follow_bootstrap import Restored, bootstrap
from stream_server.archive.follow.follow_plan import (
    Diverged,
    check_taken,
    frames_wanted,
    next_frames,
    objects_to_read,
)
from stream_server.archive.follow_position import (
    Followed,
    followed_entry,
    forget_promotion,
    resume,
)
from stream_server.archive.object_store import ArchiveError, ObjectStore
from stream_server.config import Settings
from stream_server.engine.engine import Engine
from stream_server.engine.replica import ReplicaHooks, commit_frames, write_frames
from stream_server.protocol.refusal import Refusal
from stream_server.replication.standby.mirror import Mirror
from stream_server.streams.replicated import ReplicatedStreams
from stream_server.streams.store import StreamStore

log = logging.getLogger("stream_server.archive")

READ_ONLY = "read-only replica cluster"


class ArchiveFollower:
    def __init__(
        self,
        objects: ObjectStore,
        store: StreamStore,
        hooks: ReplicaHooks,
        mirror: Mirror,
        *,
        poll_seconds: float,
    ) -> None:
        """``hooks``: the engine's (``Engine(replica=)``), never made writable, so that
        the engine refuses every batch of its own; ``mirror``: the stream layer as a
        standby's frames change it."""
        self.url = objects.url
        self.objects = objects
        self.engine: Engine = store.engine
        self.data_dir = store.engine.layout.root
        self.hooks = hooks
        self.mirror = mirror
        self.poll_seconds = poll_seconds
        # Work that writes of its own accord never runs here (as on a standby).
        store.pause_own_writes()
        self.followed = Followed(self.url)
        self.restored: Restored | None = None  # a base backup restored at start
        self.history: History = []  # the newest term's, as the archive has it
        self._histories_seen = ""  # the last history object listed
        self._last_object: dict[int, str] = {}  # per term, the last frames object read
        self.problem: str | None = None
        # What the status shows, replaced whole (it is read from other threads): the last
        # lsn applied and written, and the commit time (s) of the oldest archived frame
        # listed and not yet applied (None: none). ``followed.lsn`` moves before the write
        # (the write records it), so it is not what the status shows.
        self.shown: tuple[int, float | None] = (0, None)
        self.last_applied_at: float | None = None  # commit time (s) of the last frame applied
        # When (wall clock, s) a round that found every listed frame applied began: it then
        # held everything archived. A follower that cannot apply counts its lag from it.
        self.current_at = time.time()
        # Its /metrics series (--archive-timeout is twice the poll).
        self.collector = FollowerCollector(self.status, poll_seconds * 2)
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[list[tuple[int, list[walmod.Entry]]]] | None = None

    @staticmethod
    def from_settings(
        settings: Settings, store: StreamStore, hooks: ReplicaHooks
    ) -> ArchiveFollower:
        mirror = Mirror(ReplicatedStreams(store), lambda: store.engine.lsn)
        return ArchiveFollower(
            ObjectStore(settings),
            store,
            hooks,
            mirror,
            poll_seconds=max(settings.archive_timeout / 2, 0.05),
        )

    def bootstrap(self) -> None:
        """Before recovery (a blocking thread): an empty directory gets the newest base
        backup (``follow_bootstrap.py``)."""
        self.restored = bootstrap(self.objects, Path(self.data_dir))

    def refusal(self) -> Refusal:
        """Every write's answer (no Retry-After: retrying here never helps)."""
        body = (
            f"{READ_ONLY}: this server follows the archive {self.url} and takes no "
            "writes; write to the source cluster\n"
        )
        return Refusal(503, [], body.encode())

    # -------------------------------------------------------------- start and stop

    def opened(self) -> None:
        """On the recovery thread, once the engine is open: where following resumes
        (``follow_position.resume``; FollowRefused stops the start). A directory just
        restored records so at once (flushed): a restart before the first frame applied
        here must find it the archive's, not data of its own."""
        restored = self.restored
        self.followed = resume(
            self.engine, self.url, None if restored is None else (restored.lsn, restored.history)
        )
        if restored is not None:
            self.engine.write_metadata(
                [followed_entry(self.followed), forget_promotion()], flush=True
            )
        self.shown = (self.followed.lsn, None)
        self.hooks.durable = (self.followed.source_term, self.followed.lsn)
        log.info("following %s from lsn %d", self.url, self.followed.lsn)

    def start(self, ready: Callable[[], Awaitable[bool]]) -> None:
        self._task = asyncio.create_task(self._run(ready), name="archive follower")

    async def stop(self) -> None:
        """Stop following; frames being written are written first (the store closes
        after this)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writing is not None:
            await asyncio.wait([self._writing])

    async def _run(self, ready: Callable[[], Awaitable[bool]]) -> None:
        if not await ready():
            return
        while True:
            try:
                while await self.poll():
                    pass
            except Diverged as exc:
                # Nothing more can be applied here (a person rebuilds it); it goes on
                # looking, so that its status and lag say so for as long as it lasts.
                self._problem(str(exc))
            except (ArchiveError, ArchiveDamaged, ValueError) as exc:
                self._problem(str(exc))
            except Exception as exc:
                log.exception("following the archive failed")
                self._problem(repr(exc))
                if self.engine.failed:
                    return
            await asyncio.sleep(self.poll_seconds)

    def _problem(self, why: str) -> None:
        if why != self.problem:
            log.error("following the archive %s: %s", self.url, why)
        self.problem = why

    # -------------------------------------------------------------- one round

    async def poll(self) -> bool:
        """Take what the archive holds after the last frame applied, object by object;
        True when frames were applied (look again at once), False when caught up."""
        began = time.time()
        await self._read_histories()
        if not self.history:
            self.problem, self.current_at = None, began
            return False  # nothing archived yet
        check_taken(self.followed.history, self.history, self.followed.lsn)
        want = next_frames(self.history, self.followed.lsn)
        if want is None:
            raise ValueError(
                f"the archive's history {self.history} does not reach lsn {self.followed.lsn + 1}"
            )
        names = await asyncio.to_thread(self._list_term, want.term)
        if await self._read_histories():
            # A new term began while we listed: a frame of the old term we just listed
            # may be past its end (a deposed primary's). Decide again on the new history.
            return True
        applied = False
        wanted = list(objects_to_read(names, want))
        for i, name in enumerate(wanted):
            data = await asyncio.to_thread(self.objects.get, name)
            frames = frames_wanted(decode_frames_object(name, data).frames, want, self.followed.lsn)
            self._last_object[want.term] = name
            if frames:
                done, behind = self.shown
                self.shown = (done, frames[0].time_us / 1e6 if behind is None else behind)
                await self._apply(want.term, frames, last=i == len(wanted) - 1)
                applied = True
        self.problem, self.current_at = None, began
        self.shown = (self.shown[0], None)  # every frame listed is applied
        return applied or (want.last is not None and self.followed.lsn >= want.last)

    async def _read_histories(self) -> bool:
        """The newest term's history (history objects sort by term); True when there is
        a newer one than before."""
        names = await asyncio.to_thread(
            lambda: [n for n, _ in self.objects.objects(HISTORY_PREFIX, self._histories_seen)]
        )
        if not names:
            return False
        newest = names[-1]
        raw = await asyncio.to_thread(self.objects.get, newest)
        self.history = decode_history(newest, raw)
        self._histories_seen = newest
        self.followed.source_term = max(self.followed.source_term, self.history[-1][0])
        return True

    def _list_term(self, term: int) -> list[str]:
        prefix = f"{WAL_PREFIX}{term:016x}-"
        after = self._last_object.get(term, "")
        return [n for n, _ in self.objects.objects(prefix, after)]

    async def _apply(self, term: int, frames: list[ArchivedFrame], *, last: bool) -> None:
        """The frames through the standby's path, then to readers; ``last``: the last
        object listed (nothing listed is left unapplied after it)."""
        for f in frames:
            self.followed.took(term, f.lsn)
        # Shielded: a stop waits for the write under way (``stop``), never closes the
        # store under it.
        self._writing = asyncio.ensure_future(
            asyncio.to_thread(self._write, [f.frame for f in frames])
        )
        applied = await asyncio.shield(self._writing)
        for lsn, changes in applied:
            self.mirror.stage(lsn, changes)
        self.mirror.publish(frames[-1].lsn)
        self.last_applied_at = frames[-1].time_us / 1e6
        # The next listed object's frames were committed after this one's last, so
        # measuring from it overstates the lag a little until that object is read.
        self.shown = (frames[-1].lsn, None if last else self.last_applied_at)

    def _write(self, frames: list[bytes]) -> list[tuple[int, list[walmod.Entry]]]:
        written = write_frames(self.engine, self.hooks, frames)
        if written is None:
            return []
        # How far this directory followed, in the frames' own LMDB transaction.
        written.appended.frames[-1][1].append(followed_entry(self.followed))
        return [(lsn, changes) for lsn, _, changes in commit_frames(self.engine, written)]

    # -------------------------------------------------------------- status

    def lag(self) -> float:
        """Seconds behind the archive: now minus the commit time, at the source, of the
        oldest archived frame listed and not applied; 0 when every frame listed is
        applied. One that cannot apply (``problem``) cannot know what it misses: its lag
        runs from the start of the last round that found it caught up, so that it grows
        for as long as it is stuck."""
        _, behind = self.shown
        now = time.time()
        if behind is not None:
            return max(0.0, now - behind)
        if self.problem is not None:
            return max(0.0, now - self.current_at)
        return 0.0

    def unready(self) -> str | None:
        """Why ``/readyz`` must answer 503 (None: ready): a follower that cannot apply
        serves data that only ages."""
        why = self.problem
        return None if why is None else f"not following the archive {self.url}: {why}"

    def status(self) -> dict[str, object]:
        """For ``GET /_archive/status``: role ``following``, the lsn applied, the lag
        (``lag``), and the problem that stops it."""
        applied, _ = self.shown
        return {
            "role": "following",
            "url": self.url,
            "applied_lsn": applied,
            "source_term": self.followed.source_term,
            "lag_seconds": self.lag(),
            "last_applied_at": self.last_applied_at,
            "failing": self.problem is not None,
            "last_error": self.problem,
        }
