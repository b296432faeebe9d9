"""A worker's limits: the writer's rate limiter and live readers' slots, over the link.

A client's connections may land on any worker, so a limit counted per worker would
let it through N times; the pod has one limiter and one set of slots, the writer's,
and a worker asks them (``host.py``: ``admit``, ``hold`` and ``release``). The hold
lasts until the worker releases it, or until its link goes (a killed worker gives
its slots back).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from stream_server.protocol.context import Limiter, Slots
from stream_server.protocol.live import MODES
from stream_server.workers.linked_store import LinkedStore


class LinkedLimiter:
    """``Limiter``: the writer's ``RateLimiter`` decides."""

    def __init__(self, store: LinkedStore) -> None:
        self.store = store

    async def admit(self, client: str) -> float:
        wait: float = await self.store.call("admit", client)
        return wait


class LinkedSlots:
    """``Slots``: the writer's ``ReaderSlots`` decide; ``by_mode`` counts this worker's."""

    def __init__(self, store: LinkedStore) -> None:
        self.store = store
        self.by_mode: dict[str, int] = dict.fromkeys(MODES, 0)

    @contextlib.asynccontextmanager
    async def held(self, mode: str, client: str) -> AsyncIterator[None]:
        rid = await self.store.hold(mode, client)
        self.by_mode[mode] += 1
        try:
            yield
        finally:
            self.by_mode[mode] -= 1
            self.store.release(rid)


if TYPE_CHECKING:  # mypy checks that they offer what the protocol layer asks

    def _implements(limiter: LinkedLimiter, slots: LinkedSlots) -> tuple[Limiter, Slots]:
        return limiter, slots
