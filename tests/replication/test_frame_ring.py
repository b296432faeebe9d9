"""The primary's frame ring finds a follower's next frame by lsn, counts the bytes a
standby lacks without a scan, and survives trimming and a rewritten history; a
standby joins its adjacent record writes per stream before writing them."""

from __future__ import annotations

from stream_format import wal
from stream_server.engine.frames import coalesced as _coalesced
from stream_server.replication.primary.frame_ring import FrameRing


def filled(count: int, keep_bytes: int) -> FrameRing:
    ring = FrameRing()
    for lsn in range(1, count + 1):
        ring.append((1, lsn, b"x" * (lsn % 7 + 1)))
        while ring.size > keep_bytes and len(ring) > 1:
            ring.popleft()
    return ring


def test_frames_after_a_position_and_the_bytes_they_hold() -> None:
    ring = filled(5000, keep_bytes=10_000)
    held = list(ring)
    first = held[0][1]
    assert first > 1 and [f[1] for f in held] == list(range(first, 5001))
    assert ring[0] == held[0] and ring[-1] == held[-1] and len(ring) == len(held)
    for lsn in (0, first - 1, first, 4000, 4999, 5000, 6000):
        expected = [f for f in held if f[1] > lsn]
        assert list(ring.since(ring.first_after(lsn))) == expected, lsn
        assert ring.bytes_after(lsn) == sum(len(f[2]) for f in expected), lsn


class Unwalkable(list):  # type: ignore[type-arg]
    """A list that may be indexed and sliced, never walked from its start."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the ring was walked from its first frame")


def test_the_frames_after_a_position_are_reached_without_walking_the_ones_before() -> None:
    # Every fetch and every frame pushed to a stream asks for the newest frames;
    # walking the whole ring for them (itertools.islice did) made each cost grow
    # with the frames held, up to 256 MiB of them.
    ring = filled(20_000, keep_bytes=1 << 30)
    ring._frames = Unwalkable(ring._frames)
    assert [f[1] for f in ring.since(ring.first_after(19_998))] == [19_999, 20_000]


def test_a_rewritten_history_replaces_the_frames_from_its_lsn_on() -> None:
    ring = filled(100, keep_bytes=1 << 20)
    ring.append((2, 90, b"new"))
    assert ring[-1] == (2, 90, b"new") and len(ring) == 90
    assert [f[1] for f in ring.since(ring.first_after(88))] == [89, 90]
    assert ring.size == sum(len(f[2]) for f in ring)


def test_adjacent_writes_to_a_stream_are_joined_in_order() -> None:
    writes = [
        (wal.WRITE, 1, 0, b"ab"),
        (wal.WRITE, 2, 0, b"q"),
        (wal.WRITE, 1, 2, memoryview(b"cd")),
        (wal.WRITE, 1, 10, b"z"),
        (wal.WRITE, 1, 11, b"w"),
    ]
    assert list(_coalesced(writes)) == [(1, 0, b"abcd"), (1, 10, b"zw"), (2, 0, b"q")]
