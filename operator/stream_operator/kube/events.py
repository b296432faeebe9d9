"""Kubernetes Events on a DurableStream, and the apply that tells in one what it changed.

An Event is created through the operator's own API client, at once and in the thread
that has something to say, not through kopf's queue: most Events come from the status
rounds, which run in the operator's own worker threads (``periodic.py``), and a queued
Event reached the API after the status it explains. Said first, it is there by the time
anyone reads the status. Events are auxiliary: a failure to create one is logged, never
raised.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from stream_operator.kube.api_client import api
from stream_operator.kube.apply import apply

log = logging.getLogger("stream_operator.kube.events")

COMPONENT = "durable-streams-operator"
MAX_MESSAGE = 1024  # the API server refuses longer ones


def info(body: Mapping[str, Any], *, reason: str, message: str) -> None:
    """A Normal Event on ``body`` (the object as read)."""
    post(body, "Normal", reason, message)


def warn(body: Mapping[str, Any], *, reason: str, message: str) -> None:
    """A Warning Event on ``body`` (the object as read)."""
    post(body, "Warning", reason, message)


def post(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    meta = body["metadata"]
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 5] + " ..."
    now = datetime.datetime.now(datetime.UTC).isoformat()
    event: Any = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        response: Any = client.CoreV1Api(api()).create_namespaced_event(
            meta["namespace"], event, _preload_content=False
        )
        # Not decoded (nothing in it is needed), but read to its end and given back, or
        # the connection stays out of the pool until the response is collected.
        response.drain_conn()
        response.release_conn()
    except Exception as exc:  # auxiliary: the work it reports goes on
        log.warning("could not post the Event %s on %s: %s", reason, meta["name"], exc)


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
