"""A replication stream through a worker: the client's connection spliced to the writer's.

A standby asks a replica's port for its stream (``GET /replication/stream`` with an
``Upgrade``, ``replication/primary/sender.py``): answered ``101 Switching Protocols``, the
connection then carries frames one way and acknowledgements the other. The relay
(``proxy.py``) cannot pass that on: httpx has no upgrades, and a relay drops the
hop-by-hop headers that ask for one, so the writer would answer 426, and a standby
has no other way to follow. So a worker opens a connection of
its own to the writer's HTTP socket, sends the request's head as it came, and when
the writer switches protocols, switches the client's connection too
(``http_limits.upgrade``) and splices the two, byte for byte (which headers go
along, either way, is the relay's to say: ``proxy.py``): what one end receives
is written to the other, and an end whose output backs up stops the other from
reading (asyncio's flow control), so a standby that stops reading holds no more here
than in the writer. Either end closing closes the other. An answer that is not a
switch (a refusal: wrong term, a set of its own, 426) is relayed as it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import cast

from stream_server.protocol.http import Scope, Send

HEAD_END = b"\r\n\r\n"
HEAD_MAX = 64 * 1024  # the most a writer's answer head may take (it is a few lines)
ANSWER_TIMEOUT = 30.0  # seconds for the writer's answer head, or its whole refusal


class _End(asyncio.Protocol):
    """One end of the splice: what its transport receives goes to the other end's."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _End | None = None  # None: the splice is not made yet
        self.held = bytearray()  # received before the splice
        self.changed = asyncio.Event()  # more held, or the connection ended
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.write(data)
        else:
            self.held += data
            self.changed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.changed.set()
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def splice(self, other: _End) -> None:
        """From now on each end writes what it receives to the other; what this end
        held goes first."""
        self.other, other.other = other, self
        if self.held and other.transport is not None:
            other.transport.write(bytes(self.held))
        self.held.clear()
        if self.ended and other.transport is not None:
            other.transport.close()


def is_upgrade(scope: Scope) -> bool:
    """Whether the request asks for a protocol switch (``Connection: upgrade``)."""
    for name, value in scope["headers"]:
        if name.lower() == b"connection" and b"upgrade" in value.lower():
            return True
    return False


async def tunnel(
    send: Send,
    writer: Path,
    head: bytes,
    take_over: Callable[[asyncio.Protocol, list[tuple[bytes, bytes]]], bool] | None,
    dropped: frozenset[bytes],
) -> None:
    """Send a request's ``head`` to the writer's HTTP socket at ``writer``; when it
    switches protocols, switch the client's connection too (``take_over``,
    ``http_limits.upgrade``) and splice the two; else relay its answer, without the
    ``dropped`` headers. OSError, TimeoutError or ValueError when the writer gave no
    answer, or none of HTTP: nothing was sent to the client then."""
    loop = asyncio.get_running_loop()
    transport, end = await loop.create_unix_connection(_End, str(writer))
    spliced = False
    try:
        transport.write(head)
        async with asyncio.timeout(ANSWER_TIMEOUT):
            await _until(end, lambda: HEAD_END in end.held or len(end.held) > HEAD_MAX)
            status, headers, length = _parse(end.held, dropped)
            del end.held[: end.held.index(HEAD_END) + len(HEAD_END)]
            if status == 101:
                client = _End()
                if take_over is None or not take_over(client, headers):
                    raise ValueError("the client's connection cannot switch")
                end.splice(client)  # the client's connection is now ``client``'s
                spliced = True
                return
            # Any other answer: its body, whole (the writer closes after a refused switch).
            await _until(end, lambda: length is not None and len(end.held) >= length)
    finally:
        if not spliced:
            transport.close()
    body = bytes(end.held[:length])
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _until(end: _End, done: Callable[[], bool]) -> None:
    """Wait until ``done()``, or the writer's end closed."""
    while not done() and not end.ended:
        end.changed.clear()
        await end.changed.wait()


def _parse(
    answer: bytearray, dropped: frozenset[bytes]
) -> tuple[int, list[tuple[bytes, bytes]], int | None]:
    """An answer head's status, its headers but ``dropped`` and its length, and its
    body's length (None: until the writer closes); ValueError when there is no HTTP
    answer head."""
    head, sep, _ = bytes(answer).partition(HEAD_END)
    status_line, *lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if not sep or len(parts) < 2:
        raise ValueError("no HTTP answer head from the writer")
    headers = []
    length = None
    for line in lines:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            length = int(value)
        elif name not in dropped:
            headers.append((name, value))
    return int(parts[1]), headers, length
