"""kube-apiserver's watch cache, as far as a watching client can tell it is there.

kube-apiserver serves watches from a bounded window of recent events per resource
("Efficient detection of changes", https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
a watch that asks to resume from a resourceVersion older than the window gets, as its
first and only event, an ``ERROR`` whose object is a Status 410 ``Expired`` ("too old
resource version: X (Y)"), and the client must list again. A watch that asks for
bookmarks (``allowWatchBookmarks=true``) is sent, every so often, a ``BOOKMARK`` naming
the current resourceVersion, so that it resumes from a recent one
("Watch bookmarks", https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks).

``testkit.kube.ApiServer`` keeps one ``WatchCache`` (``watches``) and hooks it into its
event buses (``Buses``) and its watch handler; tests turn the knobs: ``window`` (events
kept per resource), ``compact()`` (forget every event now, as etcd's compaction makes the
cache start over), ``end_all()`` (close every open watch, as an API server restart or
its ``--min-request-timeout`` does; ``open`` counts the watches to end),
``bookmark_interval`` (seconds; None: no bookmarks,
the default here, so that nothing changes for a test that did not ask; the real server
sends one about every minute).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from kmock._internal import aiobus

# Large enough that no test so far writes past it. kube-apiserver sizes its window to
# the write rate, between 100 and 102400 events per resource.
DEFAULT_WINDOW = 100_000


class WatchEnded(Exception):
    """Put on a bus to end every watch reading it (``WatchCache.end_all``)."""


class WatchCache:
    """The window of event resourceVersions per resource, and the knobs a test turns."""

    def __init__(self, current_rv: Callable[[], int], window: int = DEFAULT_WINDOW) -> None:
        self._current_rv = current_rv
        self.window = window
        self.bookmark_interval: float | None = None
        self._kept: dict[Any, collections.deque[int]] = collections.defaultdict(collections.deque)
        # Per resource: the resourceVersion up to which events were dropped from the window.
        self._dropped: dict[Any, int] = collections.defaultdict(int)
        self._compacted = 0
        self.buses = Buses(self)
        self.expired = 0  # watches answered 410
        self.open: collections.Counter[Any] = collections.Counter()  # watches, by resource
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, once it watched
        self._ending: set[asyncio.Task[None]] = set()

    def record(self, resource: Any, rv: int) -> None:
        kept = self._kept[resource]
        kept.append(rv)
        while len(kept) > max(self.window, 0):
            self._dropped[resource] = kept.popleft()

    def compact(self) -> None:
        """Forget every event so far: a watch resuming from before now gets 410."""
        self._compacted = self._current_rv()
        self._kept.clear()

    def oldest(self, resource: Any) -> int:
        """The oldest resourceVersion a watch of ``resource`` may resume from."""
        return max(self._dropped[resource], self._compacted)

    def too_old(self, resource: Any, since: str | None) -> dict[str, Any] | None:
        """The ERROR event kube-apiserver answers a watch from ``since`` with, if it
        is older than the window; None if the watch is served (no resourceVersion, or
        "0": from any point, which is now)."""
        if not since or since == "0":
            return None
        try:
            asked = int(since)
        except ValueError:
            return None  # served as the emulator always has: every object replayed
        oldest = self.oldest(resource)
        if asked >= oldest:
            return None
        self.expired += 1
        return {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {asked} ({oldest})",
                "reason": "Expired",
                "code": 410,
            },
        }

    def end_all(self) -> None:
        """Close every open watch (the client sees its stream end, and watches again).
        Callable from any thread (a test's): done on the server's loop, soon after."""
        if self._loop is None:
            return  # no watch was ever opened

        async def end() -> None:
            for bus in list(self.buses.values()):
                await bus.put(WatchEnded())

        def start() -> None:
            task = asyncio.get_running_loop().create_task(end())
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

        self._loop.call_soon_threadsafe(start)

    async def mark(self, resource: Any) -> Position:
        """Where a watch starts reading ``resource``'s events. Taken under the server's
        lock with the snapshot the watch replays first: a write falls before both or
        after both, so none is lost between them and none comes twice."""
        self._loop = asyncio.get_running_loop()
        bus = self.buses[resource]
        marker = await bus.mark()
        self.open[resource] += 1
        return Position(resource, marker, bus.streamed_count)

    async def follow(
        self, position: Position, kind: str, bookmarks: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """The events after ``position`` for one watch, and its bookmarks when asked and
        enabled; ends when ``end_all`` is called."""
        resource, marker = position.resource, position.marker
        bus = marker.bus
        interval = self.bookmark_interval if bookmarks else None
        api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        queue: asyncio.Queue[Any] = asyncio.Queue()
        pumped = [0]

        async def pump() -> None:
            try:
                async for item in bus.stream(since=marker):
                    pumped[0] += 1
                    queue.put_nowait(item)
            except Exception as exc:  # WatchEnded, or the bus failing: the watch ends
                queue.put_nowait(exc)

        task = asyncio.get_running_loop().create_task(pump())
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=interval)
                except TimeoutError:
                    # Only when every event put so far reached this watch: a bookmark
                    # promises that nothing at or before its resourceVersion is to come.
                    if queue.empty() and position.start + pumped[0] == bus.streamed_count:
                        yield bookmark(api_version, kind, self._current_rv())
                    continue
                if isinstance(item, WatchEnded):
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            task.cancel()
            self.open[resource] -= 1
            await bus.unmark(marker)


@dataclasses.dataclass(frozen=True)
class Position:
    """A watch's place in its resource's events (``WatchCache.mark``)."""

    resource: Any
    marker: aiobus.BusMark[Any]
    start: int  # how many events the bus had been given at the mark


def bookmark(api_version: str, kind: str, rv: int) -> dict[str, Any]:
    """A BOOKMARK event: the kind with only ``metadata.resourceVersion`` set."""
    return {
        "type": "BOOKMARK",
        "object": {
            "kind": kind,
            "apiVersion": api_version,
            "metadata": {"resourceVersion": str(rv)},
        },
    }


class _RecordingBus(aiobus.Bus[Any]):
    """kmock's event bus, noting each event's resourceVersion in the window."""

    def __init__(self, cache: WatchCache, resource: Any) -> None:
        super().__init__()
        self._cache = cache
        self._resource = resource

    async def put(self, *items: Any) -> None:
        for item in items:
            if isinstance(item, dict):
                rv = ((item.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                if rv is not None and str(rv).isdigit():
                    self._cache.record(self._resource, int(rv))
        await super().put(*items)


class Buses(dict[Any, aiobus.Bus[Any]]):
    """kmock's ``_buses`` (a bus per resource, made on first use), recording buses."""

    def __init__(self, cache: WatchCache) -> None:
        super().__init__()
        self._cache = cache

    def __missing__(self, resource: Any) -> aiobus.Bus[Any]:
        bus = self[resource] = _RecordingBus(self._cache, resource)
        return bus
