"""Kubernetes Events on a DurableStream, posted through kopf's queue, and the apply that
tells in one what it changed.

kopf types the object an Event is about as its ``Body`` view; the operator holds the
object as the API returned it (a dict), which kopf takes as it is at runtime. The cast
is made here once, as kopf's ``bodies`` module suggests for untyped bodies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client

from stream_operator.apply import apply


def info(body: Mapping[str, Any], *, reason: str, message: str) -> None:
    """A Normal Event on ``body`` (the object as read)."""
    kopf.info(cast(kopf.Body, body), reason=reason, message=message)


def warn(body: Mapping[str, Any], *, reason: str, message: str) -> None:
    """A Warning Event on ``body`` (the object as read)."""
    kopf.warn(cast(kopf.Body, body), reason=reason, message=message)


def apply_and_tell(ac: client.ApiClient, obj: dict[str, Any], body: dict[str, Any]) -> None:
    """Apply ``obj``, and say on ``body`` (its DurableStream) what changed: created,
    patched, or corrected (drift undone: a Warning naming the fields). Nothing is said of
    an object that was already as rendered."""
    outcome, drift = apply(ac, obj)
    if outcome == "unchanged":
        return
    what = f"{outcome} {obj['kind']} {obj['metadata']['name']}"
    if outcome == "corrected":
        warn(body, reason="DriftCorrected", message=f"{what} (changed: {', '.join(drift)})")
    else:
        info(body, reason=outcome.capitalize(), message=what)
