"""The operator's one call to a server: ask the primary to hand its Lease to a standby.

``POST <primary>/replication/switchover`` with ``{"to": target, "timeout": s}`` and the
replica set's peer token as a Bearer token (the Secret ``<name>-replication``; the
server-operator contract in docs/replication.md). The primary holds new writes, waits
until the target has every written batch, moves the Lease to it by compare-and-swap and
becomes a standby; 200 means the Lease names the target. 409 (not the primary, no
candidate, target not in sync) and 503 (the target did not catch up in time: the old
primary resumed) change nothing, and neither does a call that got no answer: the
operator reads the Lease again next round and tries again.

The peer token is created here too: once per replica set, never rotated by the operator.
urllib3 (the kubernetes client's own HTTP library) makes the call: no new dependency.
"""

from __future__ import annotations

import json
import secrets
import ssl
from dataclasses import dataclass
from typing import Any

import urllib3

SWITCHOVER_PATH = "/replication/switchover"
# How long the primary may hold writes waiting for the target (the server's default is
# 10 s); the HTTP call waits a little longer than that for the answer.
SWITCHOVER_TIMEOUT = 10.0
TOKEN_KEY = "token"


def new_token() -> str:
    """32 random bytes, URL-safe base64: the replica set's shared peer secret."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class SwitchoverOutcome:
    """What the operator made of the call: ``ok`` with the new primary and term the
    primary answered, or why not (its refusal, or no answer at all)."""

    ok: bool
    why: str = ""
    primary: str = ""
    term: int = 0
    paused_ms: float = 0.0


def request_switchover(
    url: str,
    token: str,
    target: str,
    *,
    timeout: float = SWITCHOVER_TIMEOUT,
    verify: bool | str = True,
) -> SwitchoverOutcome:
    """Ask the primary at ``url`` (an origin, ``http://pod.headless.ns.svc:4437``) to hand
    the Lease to ``target``; never raises for what the server or the network says.
    ``verify``: check an https server's certificate (True: the system's CAs; a PEM
    string: that CA, e.g. the ``ca.crt`` cert-manager writes into the TLS Secret)."""
    pool = urllib3.PoolManager(
        cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE,
        ca_cert_data=verify if isinstance(verify, str) else None,
        retries=False,
        timeout=urllib3.Timeout(connect=5.0, read=timeout + 5.0),
    )
    try:
        response = pool.request(
            "POST",
            url.rstrip("/") + SWITCHOVER_PATH,
            body=json.dumps({"to": target, "timeout": timeout}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
    except urllib3.exceptions.HTTPError as exc:
        return SwitchoverOutcome(False, f"no answer from {url}: {exc.__class__.__name__}: {exc}")
    finally:
        pool.clear()
    try:
        body = json.loads(response.data or b"{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if response.status == 200:
        return SwitchoverOutcome(
            True,
            primary=str(body.get("primary") or target),
            term=int(body.get("term") or 0),
            paused_ms=float(body.get("paused_ms") or 0.0),
        )
    error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
    code = error.get("code") or response.reason or ""
    detail = error.get("message") or response.data[:200].decode("utf-8", "replace")
    why = f"{response.status} {code}: {detail}".rstrip(": ")
    if response.headers.get("Retry-After"):
        why += f" (Retry-After {response.headers['Retry-After']})"
    return SwitchoverOutcome(False, why)
