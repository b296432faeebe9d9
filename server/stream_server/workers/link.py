"""The link between a worker process and the writer: batched messages on a Unix socket.

A message is a tuple. Everything one side queues in one turn of its event loop goes
in one frame (a 4-byte length, then a pickle of the list), so the 64 appends a
busy worker parsed together cost one write and one wake-up on each side, not 64:
the writer's serial cost per append is what bounds the pod (issue 28). Pickle is
safe here because both ends are this server's own processes, on a socket in a
directory only its user can enter (``Supervisor``).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable
from typing import Any, cast

log = logging.getLogger("stream_server.workers")

HEADER = struct.Struct("!I")
PROTOCOL = pickle.HIGHEST_PROTOCOL

Messages = Callable[[list[Any]], None]


class Link(asyncio.Protocol):
    """One end of a link: ``send`` queues, one frame per loop turn; ``on_messages`` gets
    each frame's messages in order; ``on_lost`` is called once when the socket closes."""

    def __init__(self, on_messages: Messages, on_lost: Callable[[], None]) -> None:
        self.on_messages = on_messages
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._queued: list[Any] = []
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def send(self, message: Any) -> None:
        if not self._queued:
            self._loop.call_soon(self._flush)
        self._queued.append(message)

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        if self.transport is None or self.transport.is_closing():
            return
        data = pickle.dumps(queued, PROTOCOL)
        self.transport.writelines((HEADER.pack(len(data)), data))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        end, have = 0, len(buffer)
        frames: list[Any] = []
        while have - end >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, end)
            if have - end - HEADER.size < size:
                break
            start = end + HEADER.size
            frames.extend(pickle.loads(buffer[start : start + size]))
            end = start + size
        if end:
            del buffer[:end]
        if frames:
            self.on_messages(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_lost()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def encode_error(exc: BaseException) -> tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]:
    """An exception as its class, args and attributes: the store's errors take other
    arguments than they keep, so pickling them whole would not rebuild them."""
    return type(exc), exc.args, dict(getattr(exc, "__dict__", {}))


def decode_error(
    value: tuple[type[BaseException], tuple[Any, ...], dict[str, Any]],
) -> BaseException:
    cls, args, state = value
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc
