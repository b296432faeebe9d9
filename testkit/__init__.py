"""Test-only parts that stand in for what cannot run here: a Kubernetes API server, a kubelet."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any


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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
