"""The primary's side of a replication stream: frames pushed to one standby as
they become durable here, its acknowledgements read as they come.

A request per acknowledgement (the fetch this replaced) cost the primary a
request cycle through uvicorn and a task of its own for every write under a
sequential load, holding the GIL (docs/performance.md, "The write path's round
trip, third round"). A standby asks for a stream instead (``GET
/replication/stream`` with ``Upgrade: pyds-replication/2``,
``stream_endpoint.py``), gets ``101 Switching Protocols``, and the
connection becomes two byte streams, as PostgreSQL's streaming replication
keeps one connection per standby open in both directions:

- primary to standby, one ``MESSAGE`` per frame (its term, lsn, the commit
  point as of sending, the echo, the frame's length, then the frame), or
  with lsn 0 and no frame: the commit point alone, sent when it moved and no
  frame carried it and nothing was sent for ``COMMIT_LINGER`` (under load the
  next frame carries it), and as a heartbeat;
- standby to primary, one ``ACK`` per group of frames made durable, and one
  per commit-only message: its durable position (term, lsn), the commit
  point it knows and a stamp of its clock. The position is counted as the
  request's own was (``Shipper.note``).

The echo is the newest stamp received on this stream before the message was
built, and 0 unless this replica's commit point covers every acknowledged
write (``Shipper.vouching``: primary of the Lease's term, renewed within the
renew deadline) and no election can roll back what it covers
(``Shipper.settled``): with it the standby knows how current its reads are
(``freshness.py``), and a deposed or unsettled primary renews no one's
freshness. The commit point sent is ``Shipper.announced``: a primary not yet
settled tells no standby that its unconfirmed tail is committed.

Frames are pushed from the moment they are added to the ring, with no task
and no wake-up in between. Sending stops while more than ``MAX_ANSWER``
bytes are unacknowledged, so a standby that stops reading holds at most
that much here. The stream belongs to one term: the primary closes it when
it steps down or hands over, and an acknowledgement that a request would be
refused for (``Shipper.refusal``: its position diverged from ours) closes it
too; the standby then
asks again and hears why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

from stream_server.replication.peers.wire import MESSAGE, take_acks
from stream_server.replication.primary.shipping import COMMIT_LINGER, MAX_ANSWER, Shipper


class Sender(asyncio.Protocol):
    """One standby's stream, on the primary; ``Shipper.senders`` holds the open ones."""

    def __init__(
        self,
        shipper: Shipper,
        name: str,
        after_lsn: int,
        known_commit: int,
        heartbeat: float,
    ) -> None:
        self.shipper = shipper
        self.stamp = 0  # the newest stamp the standby sent on this stream (0: none yet)
        self.name = name
        self.term = shipper.roles.state.term
        self.sent_lsn = after_lsn  # frames up to here are sent, or were held already
        self.acked_lsn = after_lsn
        self.sent_commit = known_commit
        self.heartbeat = heartbeat
        self.transport: asyncio.Transport | None = None
        self._input = bytearray()
        self._beat: asyncio.TimerHandle | None = None
        self._last_sent = time.monotonic()

    # ------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.shipper.senders.add(self)
        self._beat = asyncio.get_running_loop().call_later(self.heartbeat, self._on_beat)
        self.push()

    def connection_lost(self, exc: Exception | None) -> None:
        self.shipper.senders.discard(self)
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        self.shipper.stream_lost(self.name, self.term)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ----------------------------------------------------------------- input

    def data_received(self, data: bytes) -> None:
        self._input += data
        acked = take_acks(self._input)
        if acked is None:
            return
        after_term, after_lsn, known, stamp = acked
        self.stamp = max(self.stamp, stamp)
        shipper = self.shipper
        if shipper.refusal(self.term, after_term, after_lsn) is not None:
            self.close()  # its next request hears why
            return
        self.acked_lsn = after_lsn
        self.sent_lsn = max(self.sent_lsn, after_lsn)
        self.sent_commit = max(self.sent_commit, known)
        shipper.note(self.name, after_term, after_lsn)
        if self.sent_lsn < shipper.lsn:  # frames held back by the window
            self.push()

    # ---------------------------------------------------------------- output

    def push(self) -> None:
        """Send the frames after ``sent_lsn`` that the window allows, each with the
        commit point as of now."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        shipper = self.shipper
        ring = shipper.ring
        commit = shipper.announced()
        head = self._head()
        unacked = ring.bytes_after(self.acked_lsn) - ring.bytes_after(self.sent_lsn)
        parts: list[bytes] = []
        for t, lsn, frame in ring.since(ring.first_after(self.sent_lsn)):
            if unacked and unacked + len(frame) > MAX_ANSWER:
                break
            parts += [head(t, lsn, commit, len(frame)), frame]
            unacked += len(frame)
            self.sent_lsn = lsn
        if parts:
            shipper.shipped += len(parts) // 2
            self._send(b"".join(parts), commit)

    def send_commit(self) -> float | None:
        """The commit point alone, if it moved since we last sent it and nothing
        was sent for ``COMMIT_LINGER``; else the seconds until that is so (a
        frame under way will most likely carry it), or None: nothing to send."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return None
        commit = self.shipper.announced()
        if commit <= self.sent_commit:
            return None
        wait = self._last_sent + COMMIT_LINGER - time.monotonic()
        if wait > 0:
            return wait
        self._send(self._head()(0, 0, commit, 0), commit)
        return None

    def _head(self) -> Callable[[int, int, int, int], bytes]:
        """Packs a message's head (term, lsn, commit point, frame length) with the echo
        as of now: the newest stamp received, while this replica may acknowledge."""
        echo = self.stamp if self.shipper.echoing else 0
        pack = MESSAGE.pack
        return lambda t, lsn, commit, n: pack(t, lsn, commit, echo, n)

    def _send(self, data: bytes, commit: int) -> None:
        assert self.transport is not None
        self.transport.write(data)
        self.sent_commit = max(self.sent_commit, commit)
        self._last_sent = time.monotonic()

    def _on_beat(self) -> None:
        """Say something at least every ``heartbeat``: the standby answers, and its
        answer keeps it counted as alive (``Shipper._watch``); its answer's stamp,
        echoed by the next message, keeps its reads fresh (``freshness.py``)."""
        idle = time.monotonic() - self._last_sent
        if idle >= self.heartbeat and self.transport is not None:
            commit = self.shipper.announced()
            self._send(self._head()(0, 0, commit, 0), commit)
            idle = 0.0
        self._beat = asyncio.get_running_loop().call_later(self.heartbeat - idle, self._on_beat)
