"""Kubernetes Events on a DurableStream, posted through kopf's queue.

kopf types the object an Event is about as its ``Body`` view; the operator holds the
object as the API returned it (a dict), which kopf takes as it is at runtime. The cast
is made here once, as kopf's ``bodies`` module suggests for untyped bodies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf


def info(body: Mapping[str, Any], *, reason: str, message: str) -> None:
    """A Normal Event on ``body`` (the object as read)."""
    kopf.info(cast(kopf.Body, body), reason=reason, message=message)


def warn(body: Mapping[str, Any], *, reason: str, message: str) -> None:
    """A Warning Event on ``body`` (the object as read)."""
    kopf.warn(cast(kopf.Body, body), reason=reason, message=message)
