"""The connection-level limits: what one TCP connection may cost the server.
Kept whole although long: every limit is a hook of the one uvicorn protocol
subclass below, and they share its per-connection state.

The app's own limits (body size, readers, rate) only apply once a request has
reached it; a hostile client can do harm before that, or without ever sending
a request. Each limit here closes one such hole, found by probing a real
server:

* **Head size** (``--max-header-bytes``, ``--max-headers``): the parser
  buffers a request's head until it is complete, so a head that never ends
  grew the server by 1 GiB for 64 MiB sent, and one 64 MiB header value cost
  seconds of CPU. The head is counted as it arrives and refused with 431
  as soon as it passes the limit, before it is buffered any further; each
  header, once parsed, is counted exactly against both limits, so the app
  need not check them again (``StreamServerApp.headers_checked``).
* **Head deadline** (``--header-timeout``): a connection that sends part of a
  head, or trickles it a byte at a time, holds a file descriptor and a slot
  forever. The deadline runs from the head's first byte; trickling does not
  extend it.
* **Idle deadline** (``--keep-alive-timeout``): a connection with no request
  in progress, including a fresh one that never sends anything, is closed.
  Uvicorn only arms its keep-alive timer after a response, and any byte
  disarms it; here only a new request ends idleness. A request in progress
  (a long-poll waiting, an SSE response streaming) is never cut by it.
* **Connection cap** (``--max-connections``): past the open-file limit every
  ``accept`` fails and the server cannot open its own files either, so
  half-open connections made ``/healthz`` fail for everyone. Connections over
  the cap are dropped at once, leaving descriptors for the engine. Unless
  configured, the cap is derived from the open-file limit (``server.py``).
* **Upgrade** (``scope["extensions"]["stream_server.upgrade"]``): a request
  asking for a protocol in ``UPGRADES`` goes to the app as any other; the app
  either answers it (the connection then closes: the parser stopped at the
  head) or takes the connection over for that protocol, which writes the
  ``101`` and hands the transport to the protocol object it gives. Uvicorn
  knows only WebSocket upgrades and warned of any other.
* **Abort** (``scope["extensions"]["stream_server.abort"]``): a graceful close
  keeps unsent output buffered until the client reads it, which a client that
  stopped reading never does. The app aborts instead when it gives up on a
  reader, and so does the protocol when the app fails mid-response.

The body's rate is enforced where the body is read (``read_body``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from stream_server.config import Settings
from stream_server.protocol.http import COMMON
from stream_server.response_writes import HeadWithBody

log = logging.getLogger("stream_server")

# A request line's share of the head, beyond the headers themselves: the
# method, version and a query string. The path is allowed three times its
# limit, as it may be percent-encoded.
REQUEST_LINE_ALLOWANCE = 8192
# Headers whose ": " and CRLF are allowed beyond --max-header-bytes.
MAX_SEPARATED_HEADERS = 1024
# httptools parses a request target with 16-bit offsets: a longer one fails to parse
# (only once the head is complete), and is refused as a head too large (431).
MAX_PARSED_URL_BYTES = 0xFFFF
# After a refusal, input is read and dropped this long, so the client sees the
# response rather than a reset caused by unread input (a "lingering close").
LINGER_SECONDS = 2.0
# SO_LINGER on with a zero timeout: close() resets the connection.
RESET_ON_CLOSE = struct.pack("ii", 1, 0)
# Upgrades the app may take a connection over for (``replication/primary/sender.py``).
UPGRADES = (b"pyds-replication/2",)
# Refused connections are logged at most this often, with a count.
CAP_LOG_INTERVAL = 5.0


class HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a refused head."""


@dataclass
class CapLog:
    """Counts connections refused at the cap and logs them now and then, not each one."""

    cap: int
    refused: int = 0
    last: float = field(default=float("-inf"))

    def note(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self.last >= CAP_LOG_INTERVAL:
            log.warning(
                "connection cap of %d reached: %d connection(s) refused since the last report",
                self.cap,
                self.refused,
            )
            self.refused = 0
            self.last = now


def head_limit(settings: Settings) -> int:
    """Bytes a request head may take on the wire: headers with their separators, and
    a request line. ``on_header`` checks the headers alone exactly.

    The separators' share is bounded too: a huge ``--max-headers`` must not let
    the head grow with it (each parsed header costs far more than its bytes).
    """
    separators = 4 * min(settings.max_headers, MAX_SEPARATED_HEADERS)
    return (
        settings.max_header_bytes
        + separators
        + 3 * settings.max_path_bytes
        + REQUEST_LINE_ALLOWANCE
    )


def refusal(status: int, reason: bytes) -> bytes:
    """A complete response that ends the connection, written by the protocol itself."""
    head = [STATUS_LINE[status]]
    head.extend(b"%s: %s\r\n" % (name, value) for name, value in COMMON)
    head.append(b"content-type: text/plain; charset=utf-8\r\n")
    head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(reason))
    return b"".join(head) + reason


HEAD_TOO_LARGE = refusal(431, b"request headers too large or too many\n")
HEAD_TOO_SLOW = refusal(408, b"request headers not received in time\n")


def reset(transport: asyncio.WriteTransport) -> None:
    """Abort a transport with a TCP reset, freeing its buffers here and in the kernel."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
    transport.abort()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with the connection-level limits.

    Bound to settings by ``protocol_class``; the class attributes below are
    what it reads.
    """

    head_limit: int = 65536 + 4 * 100 + 3 * 1024 + REQUEST_LINE_ALLOWANCE  # the defaults
    max_headers: int = 100
    max_header_bytes: int = 65536
    header_timeout: float = 10.0
    keep_alive_timeout: float = 30.0
    max_connections: int = 1 << 20
    cap_log: CapLog = CapLog(1 << 20)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.keep_alive_timeout  # type: ignore[assignment]
        # The parser expects head bytes (none of a body): counted against the room.
        self._head_open = True
        self._head_room = self.head_limit
        # A head has begun and is not complete: the head deadline runs.
        self._in_head = False
        self._header_bytes = 0  # of the head being parsed, names and values
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._linger: asyncio.TimerHandle | None = None
        self._extensions: dict[str, Any] = {}
        self._upgrading = False  # the parser stopped at a head asking for one of UPGRADES

    # ------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            reset(transport)
            self.cap_log.note()
            return
        super().connection_made(transport)
        # Shared by the connection's requests: the app only reads it.
        self._extensions = {
            "stream_server.abort": self.abort,
            "stream_server.upgrade": self.upgrade,
        }
        # A fresh connection is idle until its first request begins.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.keep_alive_timeout, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self.flow is None:  # dropped at the cap: never set up
            return
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drop the connection at once, with whatever output is still buffered.

        The socket is reset (SO_LINGER 0), not closed: a closed socket keeps
        its unsent kernel buffer for as long as the peer's window stays shut.
        The request sees a disconnect at once, as it would after a reset.
        """
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        reset(self.transport)

    def upgrade(self, protocol: asyncio.Protocol, headers: list[tuple[bytes, bytes]]) -> bool:
        """Answer ``101 Switching Protocols`` and hand the connection to ``protocol``:
        uvicorn forgets it (its request is complete, no timer runs, a shutdown no
        longer waits for it); ``protocol`` owns it from here. False, and nothing
        done, when the request did not ask for an upgrade (the parser stopped for
        none: no ``connection: upgrade``)."""
        cycle = self.cycle
        if not self._upgrading or cycle is None or cycle.response_started:
            return False
        cycle.response_started = cycle.response_complete = True
        self._upgrading = False
        self.connections.discard(self)
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        head = [b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n"]
        head.extend(b"%s: %s\r\n" % (name, value) for name, value in headers)
        self.transport.write(b"".join(head) + b"\r\n")
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        return True

    def on_response_complete(self) -> None:
        if self._upgrading:  # answered, not taken over: the parser cannot go on
            self._upgrading = False
            self.transport.close()
        HttpToolsProtocol.on_response_complete(self)

    def _busy(self) -> bool:
        """A request is in progress: being received, handled or answered."""
        cycle = self.cycle
        return (
            self._in_head
            or bool(self.pipeline)
            or (cycle is not None and not cycle.response_complete)
        )

    def timeout_keep_alive_handler(self) -> None:
        """Close an idle connection; never one with a request in progress."""
        if not self._busy():
            super().timeout_keep_alive_handler()

    # ------------------------------------------------------------------ input

    def data_received(self, data: bytes) -> None:
        if self._head_open:
            room = self._head_room - len(data)
            if room < 0:
                self._receive_past_room(data)
                return
            self._head_room = room
        try:  # _feed, inline: this is every request's path
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_stopped(exc)
        if self._in_head and self._head_timer is None and not self._refused:
            # Only a head split across reads needs its deadline armed.
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _receive_past_room(self, data: bytes) -> None:
        """Feed what is left of the head's room; refuse the head if it does not end there.

        Only the bytes that fit are parsed, so the parser never buffers more
        than the limit of one head.
        """
        if self._refused:
            return  # lingering: input is dropped
        room = self._head_room
        self._head_room = 0
        if room:
            self._feed(data[:room])
        if self._refused or self.transport.is_closing():
            return
        if self._head_open and self._head_room == 0:
            self._refuse(HEAD_TOO_LARGE)
            return
        self.data_received(data[room:])

    def _feed(self, data: bytes) -> None:
        """Uvicorn's ``data_received``, except that bytes alone do not end idleness
        (a new request does) and a refused head is not a bad request."""
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_stopped(exc)

    def _parse_stopped(self, exc: Exception) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            if self._get_upgrade() in UPGRADES:
                self._upgrading = True  # the app answers, or takes the connection (upgrade)
            elif self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        elif not self._refused and len(self.url) > MAX_PARSED_URL_BYTES:
            # Not a malformed request but a head too large (docs/limits.md): its
            # request line is longer than the parser can take.
            self._refuse(HEAD_TOO_LARGE)
        elif not self._refused:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)

    # ---------------------------------------------------------- parser hooks

    # The hooks below run for every request: the base is called directly (no
    # super()) and small helpers are inlined.

    def on_message_begin(self) -> None:
        idle = self.timeout_keep_alive_task  # a request ends idleness
        if idle is not None:
            idle.cancel()
            self.timeout_keep_alive_task = None
        self._in_head = True
        self._header_bytes = 0
        HttpToolsProtocol.on_message_begin(self)
        self.scope["extensions"] = self._extensions

    def on_header(self, name: bytes, value: bytes) -> None:
        # The exact limits (the app need not check them again): names and values
        # counted as StreamServerApp would, against --max-header-bytes and --max-headers.
        self._header_bytes += len(name) + len(value)
        if len(self.headers) >= self.max_headers or self._header_bytes > self.max_header_bytes:
            self._refuse(HEAD_TOO_LARGE)
            raise HeadRefused
        HttpToolsProtocol.on_header(self, name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_open = False
        if self._head_timer is not None:
            self._cancel_head_timer()
        HttpToolsProtocol.on_headers_complete(self)

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)
        self._head_open = True
        self._head_room = self.head_limit

    # --------------------------------------------------------------- refusal

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(HEAD_TOO_SLOW)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, response: bytes) -> None:
        """Answer a refused head and end the connection.

        Input is then dropped for ``LINGER_SECONDS`` after a half-close, so that
        a client still sending sees the answer instead of a reset. With a
        response in progress (a pipelined head), nothing can be written: abort.
        """
        self._refused = True
        self._head_open = True
        self._head_room = 0
        self._in_head = False
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            self.abort()
            return
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = self.loop.call_later(LINGER_SECONDS, self.abort)
        else:
            self.transport.close()

    # ------------------------------------------------------------------- app

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        coro = run_asgi(cycle, app)
        if getattr(self.config, "reset_contextvars", False):
            task = self.loop.create_task(coro, context=contextvars.Context())
        else:
            task = self.loop.create_task(coro)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)


async def run_asgi(cycle: RequestResponseCycle, app: ASGI3Application) -> None:
    """Run a request's app; if its response started but did not complete (the app
    raised, or gave up), abort. Uvicorn's graceful close would keep the unsent
    output buffered for a client that may never read it.

    (A wrapping coroutine costs less per request than a second done-callback.)
    """
    await cycle.run_asgi(app)
    if cycle.response_started and not (cycle.response_complete or cycle.disconnected):
        reset(cycle.transport)


def protocol_class(settings: Settings, max_connections: int) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http=``, bound to these settings."""
    attrs = {
        "head_limit": head_limit(settings),
        "max_headers": settings.max_headers,
        "max_header_bytes": settings.max_header_bytes,
        "header_timeout": settings.header_timeout,
        "keep_alive_timeout": settings.keep_alive_timeout,
        "max_connections": max_connections,
        "cap_log": CapLog(max_connections),
    }
    return type("StreamServerHttpProtocol", (LimitedHttpToolsProtocol,), attrs)
