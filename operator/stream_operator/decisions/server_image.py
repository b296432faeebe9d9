"""Which server image a DurableStream runs when its spec pins none.

The operator's own server image (``DS_OPERATOR_SERVER_IMAGE``, set by the chart
from its version) is the default image, so upgrading the operator upgrades
every server that does not pin one: a rolling restart of each of them, at a
time the platform team chose for the operator, not for the servers. The
operator-wide setting ``DS_OPERATOR_UNPINNED_SERVER_IMAGE`` (chart value
``operator.unpinnedServerImage``) decides:

- ``roll`` (the default, as before): every unpinned DurableStream takes the new
  image at once;
- ``hold``: each keeps the image it runs until its spec changes (its pods roll
  then anyway, so the new image costs no extra restart) or its owner asks with
  the annotation ``streams.pyds.dev/update-server-image`` (any value; the
  operator removes it). Meanwhile ``status.imageUpdateAvailable`` names the
  image held back, and an Event says how to take it.

The image in use is recorded on the StatefulSet (``streams.pyds.dev/server-image``:
the image and the DurableStream's generation it was chosen at), as the applied
storage is; a StatefulSet made before the record existed is read for its
template's image. Pure functions, except for the environment read in ``policy``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stream_operator import GROUP
from stream_operator.api.spec import operator_image
from stream_operator.configuration import operator_settings

POLICY_ENV = "DS_OPERATOR_UNPINNED_SERVER_IMAGE"
ROLL = "roll"
HOLD = "hold"
IN_USE = f"{GROUP}/server-image"  # on the StatefulSet
UPDATE_NOW = f"{GROUP}/update-server-image"  # on the DurableStream, set by its owner


def policy() -> str:
    """The operator-wide setting (``operator_settings``: roll or hold, checked at start)."""
    return operator_settings.current().unpinned_server_image


@dataclass(frozen=True)
class Choice:
    """The image to render, and the operator's image when that one is held back."""

    image: str
    available: str | None = None


def in_use(statefulset: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the StatefulSet records: ``{"image", "generation"}``; for one made before the
    record existed, its template's image with no generation (taken as unchanged)."""
    if statefulset is None:
        return None
    raw = ((statefulset.get("metadata") or {}).get("annotations") or {}).get(IN_USE)
    if raw:
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict) and record.get("image"):
            return record
    template = ((statefulset.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = template.get("containers") or []
    image = containers[0].get("image") if containers else None
    return {"image": image, "generation": None} if image else None


def choose(
    pinned: str | None,
    operator_image: str,
    setting: str,
    used: dict[str, Any] | None,
    generation: int | None,
    asked: bool,
) -> Choice:
    """The image for this round (see the module's docstring).

    ``pinned``: the spec's image; ``used``: ``in_use`` of the live StatefulSet;
    ``generation``: the DurableStream's; ``asked``: the ``UPDATE_NOW`` annotation is set.
    """
    if pinned:
        return Choice(pinned)
    if setting != HOLD or used is None or asked:
        return Choice(operator_image)
    if used.get("generation") not in (None, generation):
        return Choice(operator_image)  # the spec changed: the pods roll anyway
    held = str(used["image"])
    return Choice(held, operator_image if held != operator_image else None)


def record(image: str, generation: int | None) -> str:
    """The ``IN_USE`` annotation's value."""
    return json.dumps({"image": image, "generation": generation}, sort_keys=True)


def update_message(name: str, held: str, available: str) -> str:
    """What the Event says when a newer image is held back."""
    return (
        f"server image {available} is available; {name} keeps {held} "
        f"(operator setting unpinnedServerImage=hold) until its spec changes or: "
        f"kubectl annotate dstream {name} {UPDATE_NOW}=now"
    )


def for_object(ds: dict[str, Any], statefulset: dict[str, Any] | None) -> Choice:
    """``choose`` for a DurableStream as read and its live StatefulSet (None: none yet)."""
    meta = ds.get("metadata") or {}
    return choose(
        (ds.get("spec") or {}).get("image"),
        operator_image(),
        policy(),
        in_use(statefulset),
        meta.get("generation"),
        UPDATE_NOW in (meta.get("annotations") or {}),
    )


def status_fields(ds: dict[str, Any], statefulset: dict[str, Any] | None) -> dict[str, str]:
    """``image`` (what the pods' template names) and ``imageUpdateAvailable`` (the image
    held back; "" when none: the status is merge-patched, so the key stays and empties)."""
    used = in_use(statefulset)
    return {
        "image": str((used or {}).get("image") or ""),
        "imageUpdateAvailable": for_object(ds, statefulset).available or "",
    }
