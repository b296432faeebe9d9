"""One write per response: a response's head goes out with the start of its body.

Uvicorn writes a response's status line and headers to the transport when the
app sends ``http.response.start``, and the body when it sends
``http.response.body``: two ``send`` calls and, with TCP_NODELAY, two TCP
segments for a response the app sent in one step. The client wakes for the
head, then again for the body. A replicated write waits for three responses
in series (two fetch answers to standbys, then the writer's own), so each
costs it a system call and a wake-up more than it needs
(docs/performance-journal.md, "The write path's round trip").

``HeadWithBody`` stands in for the transport of one request's cycle: it
keeps the first write (the head) until the next one and sends both together;
if no body follows in the same turn of the loop (a stream of events that
starts later, a HEAD answer without a body), the head goes out alone at the
end of that turn. Everything else goes to the transport unchanged, in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

JOIN_UP_TO = 64 * 1024  # bodies up to this are copied behind the head; larger ones are not


class HeadWithBody:
    __slots__ = ("_first", "_flush", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None
        self._first = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._first:
            self._first = False
            self._held = bytes(data)
            self._flush = self._loop.call_soon(self._send_held)
            return
        held = self._take_held()
        if held is None:
            self._transport.write(data)
        elif len(data) <= JOIN_UP_TO:
            self._transport.write(held + bytes(data))
        else:
            self._transport.writelines([held, data])

    def close(self) -> None:
        self._send_held()
        self._transport.close()

    def _take_held(self) -> bytes | None:
        held, self._held = self._held, None
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        return held

    def _send_held(self) -> None:
        held = self._take_held()
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
