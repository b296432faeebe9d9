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


class _Deadline:
    """A wait's end, and the failure that says what was awaited, shared by the thread
    and event-loop forms of the wait."""

    def __init__(self, what: object, within: float, message: str | Callable[[], str]) -> None:
        self.what, self.within, self.message = what, within, message
        self.at = time.monotonic() + within

    def check(self) -> None:
        if time.monotonic() > self.at:
            told = self.message() if callable(self.message) else self.message
            raise AssertionError(f"timed out after {self.within} s waiting for {told or self.what}")


def wait_for(
    what: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    message: str | Callable[[], str] = "",
) -> T:
    """Poll ``what`` until it returns something truthy (and return that), or fail the test.

    The default deadline is generous (60 s): it only bounds how long a broken test takes
    to fail, and the suite's two workers share two cores with everything they start,
    where an operator's round or a server's answer that takes a second alone can take
    twenty (20 s, the old default, was seen run out in the kopf tests under load).

    ``message`` may be a callable so that the failure can describe the state at the moment
    of giving up (a replica set's statuses, say) rather than when the wait began."""
    deadline = _Deadline(what, timeout, message)
    while not (value := what()):
        deadline.check()
        time.sleep(0.1)
    return value


async def wait_until(
    what: Callable[[], T | None],
    *,
    within: float = 60.0,
    message: str | Callable[[], str] = "",
) -> T:
    """``wait_for`` on the event loop: for state another task sets, where the code under
    test offers nothing to await (an await it offers is better: use that)."""
    deadline = _Deadline(what, within, message)
    while not (value := what()):
        deadline.check()
        await asyncio.sleep(0.01)
    return value
