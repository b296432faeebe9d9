"""``/replication/stream`` as a bare ASGI handler, ahead of Starlette.

A stream is asked for once per connection, not once per write as the fetch it
replaced was (docs/performance.md, "Replication"); it is answered here
because its answer is mostly not a response but the hand-over of the
connection to ``sender.Sender`` once the ``101`` is written
(``scope["extensions"]["stream_server.upgrade"]``, ``http_limits.py``). The
app sends every request for this path here, whatever its method.

What Starlette did stays: the peer token is checked first, before anything
is parsed or looked up (401 with the same JSON error and
``WWW-Authenticate``), bad parameters get 400, a request during recovery
503, and a method other than GET 405. A standby that cannot follow gets the
409 of ``Shipper.refusal`` or of its set id (``identity.py``). One that does
not ask to upgrade to a version this primary speaks (``wire.VERSIONS``) gets
426 Upgrade Required, naming them.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from stream_server.protocol.http import Headers, Send, respond, text_headers
from stream_server.replication.peers.peer_token import CHALLENGE, REFUSED
from stream_server.replication.peers.wire import NUMBERS, STREAM_PATH, TERM, VERSIONS
from stream_server.replication.primary.shipping import Refusal

if TYPE_CHECKING:
    from stream_server.replication.replica_set import Replication

PATHS = (STREAM_PATH,)
UNAUTHORIZED = json.dumps(REFUSED, separators=(",", ":")).encode()
OFFERED = ", ".join(VERSIONS).encode()
UNAUTHORIZED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"www-authenticate", CHALLENGE.encode()),
]


async def serve(
    replication: Replication, scope: MutableMapping[str, Any], send: Send, *, recovered: bool
) -> None:
    """Answer one request for ``STREAM_PATH`` (``recovered``: the store's recovery
    finished)."""
    if scope["method"] != "GET":
        await _answer(send, 405, [(b"allow", b"GET")], b"only GET\n")
        return
    authorization, upgrade = _peer_headers(scope["headers"])
    if not replication.peer_allowed(authorization):
        await _answer(send, 401, UNAUTHORIZED_HEADERS, UNAUTHORIZED)
        return
    q = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
    try:
        name = q["name"]
        term, after_term, after_lsn, committed = (int(q.get(k, "0")) for k in NUMBERS)
    except (KeyError, ValueError):
        await _answer(
            send,
            400,
            [],
            b"name, term, after_term, after_lsn and committed (integers) are required\n",
        )
        return
    if not recovered:
        await _answer(send, 503, [], b"recovery not finished\n")
        return
    url = q.get("url", "")
    set_id = q.get("set", "")  # the follower's replica set (identity.py); none before set ids
    asked = upgrade.decode("latin-1").strip().lower()
    take_over = scope.get("extensions", {}).get("stream_server.upgrade")
    if take_over is None or asked not in VERSIONS:
        await _upgrade_required(send)
        return
    stream = replication.stream(
        name, term, after_term, after_lsn, committed, url=url, set_id=set_id
    )
    if isinstance(stream, Refusal):
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in stream.headers.items()]
        await _answer(send, stream.status, headers, stream.body)
        return
    headers = [(b"upgrade", asked.encode()), (TERM.encode(), b"%d" % stream.term)]
    if not take_over(stream, headers):  # no "connection: upgrade"
        await _upgrade_required(send)


def _peer_headers(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, bytes]:
    """The request's ``Authorization`` (None without) and ``Upgrade`` (b"" without)."""
    authorization = None
    upgrade = b""
    for name, value in headers:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"upgrade":
            upgrade = value
    return authorization, upgrade


async def _upgrade_required(send: Send) -> None:
    await _answer(send, 426, [(b"upgrade", OFFERED)], b"upgrade required\n")


async def _answer(send: Send, status: int, headers: Headers, body: bytes) -> None:
    if not any(k == b"content-type" for k, _ in headers):
        headers = text_headers(headers)
    await respond(send, status, headers, body)
