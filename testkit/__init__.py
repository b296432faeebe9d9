"""Test-only parts: server processes (``servers``), what a test needs installed (``needs``),
and what stands in for what cannot run here: a Kubernetes API server, a kubelet."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from testkit.servers import free_port

__all__ = ["free_port", "wait_for"]


def wait_for(what: Callable[[], Any], *, timeout: float = 20.0, message: str = "") -> Any:
    """Poll ``what`` until it returns something truthy (and return that), or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message or what}")
        time.sleep(0.1)
