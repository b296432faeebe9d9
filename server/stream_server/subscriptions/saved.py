"""Where subscriptions are saved: the stream store's keyed values, durable.

One keyed value per subscription id in the space ``subscriptions``, written through
the store's group-commit pipeline (``StreamStore.put_keyed_value``): in the WAL and
LMDB like stream metadata, acknowledged only once durable, recovered at start.
Without a store (tests of the manager's own rules) they are kept in memory,
for the life of the process.
"""

from __future__ import annotations

import logging

from stream_server.streams.interface import SubscriptionStore

log = logging.getLogger("stream_server.subscriptions")

SPACE = "subscriptions"


class SavedSubscriptions:
    """Each subscription's value (``state.py``) under its id, in the store or in memory."""

    def __init__(self, store: SubscriptionStore | None) -> None:
        self.durable = store is not None
        self._store = store
        self._memory: dict[str, bytes] = {}
        if not self.durable:
            log.warning("no store: subscriptions live in memory only")

    def load(self) -> dict[str, bytes]:
        if self._store is not None:
            return self._store.keyed_values(SPACE)
        return dict(self._memory)

    async def put(self, key: str, value: bytes | None) -> None:
        """Set (None: delete) one subscription's value; durable when it returns."""
        if self._store is not None:
            await self._store.put_keyed_value(SPACE, key, value)
        elif value is None:
            self._memory.pop(key, None)
        else:
            self._memory[key] = value
