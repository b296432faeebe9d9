"""The link between a worker and the writer: frames, and refusals that cross it whole.

A refusal must reach the client with the status and headers a single process would
send, so every store error crosses with its class and attributes; the frames must
carry whatever one side queued in a loop turn, in order, however the socket splits
them.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from dataclasses import astuple
from typing import Any

import pytest

from stream_server.engine import BatchStats
from stream_server.protocol.live import TooManyRequests
from stream_server.protocol.refusals import Decided, error_response
from stream_server.streams.errors import (
    BadRequest,
    Gone,
    NotFound,
    OffsetGone,
    ProducerFenced,
    SequenceGap,
    StreamClosed,
    Unavailable,
)
from stream_server.workers.host import batch_figures
from stream_server.workers.link import HEADER, Link, decode_error, encode_error

REFUSALS = [
    BadRequest("bad offset", **{"X-Reason": "why"}),
    NotFound("stream not found"),
    Gone("stream was deleted"),
    OffsetGone(42),
    StreamClosed("stream is closed", 1234),
    SequenceGap(5, 9),
    ProducerFenced(3),
    Unavailable("disk full", disk_full=True),
    TooManyRequests("this client holds too many live readers; retry later"),
    Decided(503, [(b"retry-after", b"1"), (b"stream-primary", b"ds-1")], b"a standby\n"),
]


@pytest.mark.parametrize("exc", REFUSALS, ids=lambda e: type(e).__name__)
def test_every_refusal_crosses_with_its_response(exc):
    crossed = decode_error(pickle.loads(pickle.dumps(encode_error(exc))))
    assert type(crossed) is type(exc)
    assert error_response(crossed) == error_response(exc)  # status, headers, reason


def test_a_refusal_pickled_whole_would_not_cross():
    """Why errors cross as class and attributes: these take other arguments than they keep."""
    with pytest.raises(TypeError):
        pickle.loads(pickle.dumps(StreamClosed("stream is closed", 7)))


async def test_frames_split_anywhere_arrive_whole_and_in_order():
    got: list[Any] = []
    done = asyncio.Event()

    def received(messages: list[Any]) -> None:
        got.extend(messages)
        if len(got) == 200:
            done.set()

    left, right = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, link = await loop.create_connection(lambda: Link(received, lambda: None), sock=right)
    frames = b"".join(
        HEADER.pack(len(body)) + body
        for body in (
            pickle.dumps([(i, "append", (b"x" * i,)) for i in range(n, n + 50)])
            for n in range(0, 200, 50)
        )
    )
    left.setblocking(False)
    for at in range(0, len(frames), 7):  # a byte stream cut in odd places
        await loop.sock_sendall(left, frames[at : at + 7])
    await asyncio.wait_for(done.wait(), 10)
    assert [m[0] for m in got] == list(range(200))
    assert got[199] == (199, "append", (b"x" * 199,))
    link.close()
    left.close()


async def test_what_one_loop_turn_sends_goes_in_one_frame():
    left, right = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, link = await loop.create_connection(lambda: Link(lambda m: None, lambda: None), sock=right)
    for i in range(64):
        link.send((i, "append", ()))
    await asyncio.sleep(0)  # the turn ends: the flush runs
    left.setblocking(False)
    data = await loop.sock_recv(left, 1 << 16)
    (size,) = HEADER.unpack_from(data)
    assert len(data) == HEADER.size + size  # one frame
    assert [m[0] for m in pickle.loads(data[HEADER.size :])] == list(range(64))
    link.close()
    left.close()


def test_a_batch_s_figures_cross_whole():
    """Every field of a batch's figures, the replica set's term with them, reaches the
    worker, which answers with them as a single process does (``Replication-Term``)."""
    sent = BatchStats(appends=3, bytes=30, write_seconds=0.1, fsync_seconds=0.2, term=7)
    figures = batch_figures(sent)
    assert figures is not None
    assert BatchStats(*pickle.loads(pickle.dumps(figures))) == sent
    assert len(figures) == len(astuple(sent))
