"""Work that runs only while this replica is primary (its own module, so that every
Part can name it without loading the replica set: ``role_switch.py`` runs it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrimaryWork:
    """Work that writes of its own accord: started on promotion, stopped on demotion."""

    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]
