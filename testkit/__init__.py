"""Test-only parts: server processes (``servers``), what a test needs installed (``needs``),
and what stands in for what cannot run here: a Kubernetes API server, a kubelet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from testkit.servers import free_port

__all__ = ["free_port", "wait_for", "wait_until"]

T = TypeVar("T")


def wait_for(
    what: Callable[[], T | None],
    *,
    timeout: float = 20.0,
    message: str | Callable[[], str] = "",
) -> T:
    """Poll ``what`` until it returns something truthy (and return that), or fail the test.

    ``message`` may be a callable so that the failure can describe the state at the moment
    of giving up (a replica set's statuses, say) rather than when the wait began."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            told = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout} s waiting for {told or what}")
        time.sleep(0.1)


async def wait_until(
    what: Callable[[], T | None],
    *,
    within: float = 20.0,
    message: str | Callable[[], str] = "",
) -> T:
    """``wait_for`` on the event loop: for state another task sets, where the code under
    test offers nothing to await (an await it offers is better: use that)."""
    deadline = time.monotonic() + within
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            told = message() if callable(message) else message
            raise AssertionError(f"timed out after {within} s waiting for {told or what}")
        await asyncio.sleep(0.01)
