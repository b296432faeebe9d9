"""The operator's calls to a server's archive endpoints (docs/backup.md, the contract
between the server and the operator):

- ``POST /_archive/backups``: take a base backup now; 201 with its summary
  (``id``, ``term``, ``start_lsn``, ``end_lsn``, ``time``, ``started``, ``stopped``,
  ``bytes``, ``node``); 409 when the server has no archive, 503 when the store fails;
- ``GET /_archive/status``: the continuous archive's state (``archived_lsn``,
  ``lag_seconds``, ``failing``, ``last_error``...);
- ``GET /_archive/backups``: the backups and the recoverable range.

Authenticated as the switchover call is: the replica set's peer token as a Bearer
token (a single server with no tokens answers anyone). urllib3, as switchover_call.py:
never raises for what the server or the network says, a ``Reply`` says it.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from typing import Any

import urllib3

BACKUPS_PATH = "/_archive/backups"
STATUS_PATH = "/_archive/status"
# A status read is part of a status round: short. A backup uploads a snapshot of the
# whole data directory before it answers: as long as an hour.
STATUS_TIMEOUT = 3.0
BACKUP_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Reply:
    """``ok`` and the answer's JSON object, or why not (an HTTP refusal or no answer)."""

    ok: bool
    body: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    status: int = 0


def _call(
    method: str,
    url: str,
    token: str | None,
    *,
    timeout: float,
    verify: bool | str = True,
) -> Reply:
    pool = urllib3.PoolManager(
        cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE,
        ca_cert_data=verify if isinstance(verify, str) else None,
        retries=False,
        timeout=urllib3.Timeout(connect=min(5.0, timeout), read=timeout),
    )
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = pool.request(
            method, url, body=b"{}" if method == "POST" else None, headers=headers
        )
    except urllib3.exceptions.HTTPError as exc:
        return Reply(False, why=f"no answer from {url}: {exc.__class__.__name__}: {exc}")
    finally:
        pool.clear()
    try:
        body = json.loads(response.data or b"{}")
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    if 200 <= response.status < 300:
        return Reply(True, body=body, status=response.status)
    error = body.get("error")
    if isinstance(error, dict):
        error = error.get("message") or error.get("code")
    detail = str(error or response.data[:200].decode("utf-8", "replace")).strip()
    return Reply(
        False, body=body, why=f"{response.status}: {detail}".rstrip(": "), status=response.status
    )


def request_backup(origin: str, token: str | None, *, verify: bool | str = True) -> Reply:
    """Ask the server at ``origin`` (``http://pod.headless.ns.svc:4437``) for a base backup."""
    return _call(
        "POST", origin.rstrip("/") + BACKUPS_PATH, token, timeout=BACKUP_TIMEOUT, verify=verify
    )


def archive_status(origin: str, token: str | None, *, verify: bool | str = True) -> Reply:
    """The archive's state as the server at ``origin`` reports it."""
    return _call(
        "GET", origin.rstrip("/") + STATUS_PATH, token, timeout=STATUS_TIMEOUT, verify=verify
    )


def list_backups(origin: str, token: str | None, *, verify: bool | str = True) -> Reply:
    """The backups and the recoverable range, as the server at ``origin`` lists them."""
    return _call("GET", origin.rstrip("/") + BACKUPS_PATH, token, timeout=30.0, verify=verify)
