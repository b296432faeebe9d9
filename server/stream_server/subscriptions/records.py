"""Where subscription records are kept: the stream store's keyed records, durable.

One record per subscription id in the space ``subscriptions``, written through
the store's group-commit pipeline (``StreamStore.put_record``): in the WAL and
LMDB like stream metadata, acknowledged only once durable, recovered at start.
A store without keyed records (an older engine) keeps them in memory, so the
feature still works there, for the life of the process.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger("stream_server.subscriptions")

SPACE = "subscriptions"


class RecordStore(Protocol):
    async def put_record(self, space: str, key: str, value: bytes | None) -> None: ...

    def records(self, space: str) -> dict[str, bytes]: ...


class SubscriptionRecords:
    def __init__(self, store: object) -> None:
        self.durable = hasattr(store, "put_record") and hasattr(store, "records")
        self._store: RecordStore | None = store if self.durable else None  # type: ignore[assignment]
        self._memory: dict[str, bytes] = {}
        if not self.durable:
            log.warning("the store keeps no records: subscriptions live in memory only")

    def load(self) -> dict[str, bytes]:
        if self._store is not None:
            return self._store.records(SPACE)
        return dict(self._memory)

    async def put(self, key: str, value: bytes | None) -> None:
        """Set (None: delete) one record; durable when it returns."""
        if self._store is not None:
            await self._store.put_record(SPACE, key, value)
        elif value is None:
            self._memory.pop(key, None)
        else:
            self._memory[key] = value
