"""The replica set's peer token, rotated so that a copy that got out stops working: every
``DS_OPERATOR_PEER_TOKEN_ROTATION`` seconds (30 days by default) and at once when the
DurableStream's ``streams.pyds.dev/rotate-peer-token`` annotation takes a new value.

The kubelet updates each pod's copy of the Secret at its own moment, and the servers
re-read the file when it changes (stream_server/replication/peers/peer_token.py: one token a
line, the first sent, every one accepted). So a rotation is three writes, each
``PROPAGATION`` after the last, and no two neighbouring versions refuse each other:

1. ``old`` + ``new``: the new token is accepted everywhere, still not sent;
2. ``new`` + ``old``: the new token is sent, the old one still accepted;
3. ``new`` alone.

Where it is in that sequence is kept on the Secret's annotations, so an operator
restarted (or another one taking the lead) carries on. ``step`` is pure; ``rotate``
writes the Secret (a replace at the version read: a 409 waits for the next round).
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP
from stream_operator.configuration import operator_settings
from stream_operator.kube import events
from stream_operator.kube.apply import read
from stream_operator.kube.switchover_call import new_token
from stream_operator.specs.render import replication_secret_name

TOKEN_KEY = "token"
REQUEST = f"{GROUP}/rotate-peer-token"  # on the DurableStream: a new value rotates now
HANDLED = f"{GROUP}/rotation-request-handled"  # on the Secret: the value last acted on
PHASE = f"{GROUP}/token-phase"  # adding, then sending; absent when one token
SINCE = f"{GROUP}/token-since"  # when the current phase (or the current token) began
# Long enough for every kubelet to have updated its copy of the Secret.
PROPAGATION = datetime.timedelta(minutes=10)


def sent_token(value: str | None) -> str | None:
    """The token to send: the first line of the Secret's ``token`` (None: none)."""
    lines = [line.strip() for line in (value or "").splitlines() if line.strip()]
    return lines[0] if lines else None


@dataclass(frozen=True)
class Rotation:
    tokens: list[str]
    annotations: dict[str, str]
    why: str


def _since(annotations: Mapping[str, str]) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(annotations[SINCE])
    except (KeyError, ValueError):
        return None


def step(
    tokens: list[str],
    annotations: Mapping[str, str],
    request: str | None,
    now: datetime.datetime,
    period: datetime.timedelta,
    new_token: str,
) -> Rotation | None:
    """The Secret's next tokens and annotations (None: nothing to do now)."""
    out = dict(annotations)
    stamp = now.isoformat()
    since = _since(annotations)
    phase = annotations.get(PHASE)
    if phase == "adding" and len(tokens) == 2:
        if since is not None and now - since < PROPAGATION:
            return None
        return Rotation([tokens[1], tokens[0]], out | {PHASE: "sending", SINCE: stamp}, "sending")
    if phase == "sending" and len(tokens) == 2:
        if since is not None and now - since < PROPAGATION:
            return None
        out.pop(PHASE, None)
        return Rotation([tokens[0]], out | {SINCE: stamp}, "the old token retired")
    requested = bool(request) and request != annotations.get(HANDLED)
    if since is None and not requested:
        # A token made before rotation existed: its age starts now.
        return Rotation(tokens[:1], out | {SINCE: stamp}, "")
    due = since is not None and now - since >= period
    if not (requested or due):
        return None
    if requested and request is not None:
        out[HANDLED] = request
    why = "asked for" if requested else "due"
    return Rotation([tokens[0], new_token], out | {PHASE: "adding", SINCE: stamp}, why)


def rotate(ac: client.ApiClient, ds: dict[str, Any], now: datetime.datetime | None = None) -> None:
    """One step of the peer token's rotation (nothing when none is due)."""
    meta = ds["metadata"]
    name = replication_secret_name(meta["name"])
    secret = read(ac, "Secret", meta["namespace"], name)
    raw = ((secret or {}).get("data") or {}).get(TOKEN_KEY)
    if secret is None or raw is None:
        return  # not made yet: reconcile._ensure_replication_secret makes it
    tokens = [t for t in base64.b64decode(raw).decode().splitlines() if t.strip()]
    period = datetime.timedelta(seconds=operator_settings.current().peer_token_rotation)
    request = (meta.get("annotations") or {}).get(REQUEST)
    change = step(
        tokens,
        secret["metadata"].get("annotations") or {},
        request,
        now or datetime.datetime.now(datetime.UTC),
        period,
        new_token(),
    )
    if change is None:
        return
    secret["metadata"]["annotations"] = change.annotations
    body: Any = secret  # a plain dict: the client sends it as it is
    secret["data"] = {TOKEN_KEY: base64.b64encode("\n".join(change.tokens).encode()).decode()}
    try:
        client.CoreV1Api(ac).replace_namespaced_secret(name, meta["namespace"], body)
    except ApiException as exc:
        if exc.status in (404, 409):
            return
        raise
    if change.why:
        message = f"Secret {name}: peer token rotation, {change.why}"
        events.info(ds, reason="PeerTokenRotation", message=message)
