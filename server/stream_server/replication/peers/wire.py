"""The replication wire format: what a primary and a standby both encode or decode.

Both ends of a replica set's connection (the primary's ``sender.py`` and
``stream_endpoint.py``; the standby's ``standby/receiver.py``) read the same bytes,
and a rolling update has a new primary talk to an old standby or the
reverse, so every layout lives here once, next to the versions that name it.
Pure: no I/O, no state.

A standby follows over HTTP/1.1: ``GET /replication/stream`` (its query names
the follower's durable position, ``NUMBERS``) upgraded to ``UPGRADE``, whose
``101`` names the primary's term (``TERM``). The primary then pushes messages
(``MESSAGE``: frame term, lsn (0: no frame), commit point, echo, frame
length, then the frame) and the standby answers each with its durable
position (``ACK``: term, lsn, commit point it knows, its clock's stamp). A
primary that does not speak the version asked answers 426, its ``Upgrade``
header naming the versions it does (``VERSIONS``): how the next change of
these layouts is bridged (docs/compatibility.md).

The frames themselves are the format package's (``stream_format.wal``).
"""

from __future__ import annotations

import struct

STREAM_PATH = "/replication/stream"
# A stream request's integer query parameters (its strings: name, url, set).
NUMBERS = ("term", "after_term", "after_lsn", "committed")

UPGRADE = "pyds-replication/2"
VERSIONS = {UPGRADE: 2}  # the stream versions a primary serves, by their Upgrade token

TERM = "replication-term"  # a stream's 101 names the primary's term (lower case)

# Primary to standby: frame term, lsn (0: no frame), commit point, echo, frame length.
MESSAGE = struct.Struct("<QQQQI")
# Standby to primary: the term and lsn of its durable position, the commit point it
# knows, its clock (ns).
ACK = struct.Struct("<QQQQ")

Shipped = tuple[int, int, bytes]  # a frame as shipped: term, lsn, the frame


def message(term: int, lsn: int, commit: int, echo: int, frame: bytes = b"") -> bytes:
    """One stream message (a frame, or none: ``lsn`` 0, the commit point alone)."""
    return MESSAGE.pack(term, lsn, commit, echo, len(frame)) + frame


def ack(term: int, lsn: int, commit: int, stamp: int) -> bytes:
    """A standby's acknowledgement: its durable position, the commit point it knows,
    and its clock's stamp (echoed back by the primary's next message)."""
    return ACK.pack(term, lsn, commit, stamp)


def take_messages(buffer: bytearray) -> tuple[list[Shipped], int, int] | None:
    """The whole stream messages at the start of ``buffer``, removed from it: their
    frames (term, lsn, frame), the highest commit point and the highest echo they
    carry (both only grow along a stream, so the pair is a conservative one). None
    while not even one message is whole."""
    frames: list[Shipped] = []
    commit = echo = 0
    off = 0
    while len(buffer) - off >= MESSAGE.size:
        t, lsn, point, stamp, n = MESSAGE.unpack_from(buffer, off)
        end = off + MESSAGE.size + n
        if end > len(buffer):
            break
        if lsn:
            frames.append((t, lsn, bytes(buffer[off + MESSAGE.size : end])))
        commit = max(commit, point)
        echo = max(echo, stamp)
        off = end
    if not off:
        return None
    del buffer[:off]
    return frames, commit, echo


def take_acks(buffer: bytearray) -> tuple[int, int, int, int] | None:
    """The newest whole acknowledgement in ``buffer`` (positions and stamps only grow:
    the last says all the earlier ones do), every whole one removed. None while none
    is whole."""
    size = ACK.size
    whole = len(buffer) - len(buffer) % size
    if not whole:
        return None
    after_term, after_lsn, known, stamp = ACK.unpack_from(buffer, whole - size)
    del buffer[:whole]
    return after_term, after_lsn, known, stamp
