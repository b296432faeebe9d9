"""An object applied, and an Event on its DurableStream saying what changed: created,
patched, or corrected (drift undone, a Warning naming the fields). Nothing is said of
an object that was already as rendered."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from stream_operator import events
from stream_operator.apply import apply


def apply_and_tell(ac: client.ApiClient, obj: dict[str, Any], body: dict[str, Any]) -> None:
    """Apply ``obj``; ``body``: the DurableStream the Event is posted on."""
    outcome, drift = apply(ac, obj)
    if outcome == "unchanged":
        return
    what = f"{outcome} {obj['kind']} {obj['metadata']['name']}"
    if outcome == "corrected":
        events.warn(body, reason="DriftCorrected", message=f"{what} (changed: {', '.join(drift)})")
    else:
        events.info(body, reason=outcome.capitalize(), message=what)
