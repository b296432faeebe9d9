"""The format package's frame and key codecs (``stream_format.wal.decode_frame``,
``stream_format.meta.key_stream_id`` / ``key_producer``): the one place that reads a
shipped frame or a metadata key, for the engine, recovery, replication and snapshots."""

from __future__ import annotations

import pytest

from stream_format import wal
from stream_format.meta import (
    DB_INFO,
    DB_TAILS,
    id_key,
    index_key,
    key_index,
    key_producer,
    key_stream_id,
    producer_key,
)

ENTRIES = [
    (wal.WRITE, 7, 20, b"record bytes"),
    (wal.PUT, DB_TAILS, id_key(7), b"\x01" * 24),
    (wal.DELETE, DB_INFO, b"gone"),
]


def test_a_frame_decodes_to_its_lsn_and_entries() -> None:
    lsn, entries = wal.decode_frame(wal.encode_frame(42, ENTRIES))
    assert lsn == 42
    assert [(e[0], e[1], e[2], bytes(e[3])) for e in entries[:1]] == [ENTRIES[0]]
    assert entries[1:] == ENTRIES[1:]


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f[:-1],  # cut short
        lambda f: f + b"\x00",  # bytes after it
        lambda f: f[:-1] + bytes([f[-1] ^ 1]),  # a flipped bit: the checksum fails
        lambda f: b"\x00" + f[1:],  # not a frame's magic
        lambda f: f[:5],  # shorter than a header
    ],
)
def test_a_damaged_frame_is_corrupt(damage) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(wal.WalCorrupt):
        wal.decode_frame(damage(wal.encode_frame(42, ENTRIES)))


def test_keys_give_back_their_stream_and_producer() -> None:
    assert key_stream_id(id_key(2**40 + 3)) == 2**40 + 3
    assert key_stream_id(index_key(9, 12345)) == 9
    assert key_stream_id(memoryview(id_key(5))) == 5
    assert key_producer(producer_key(9, "writer-é")) == (9, "writer-é")
    assert key_producer(producer_key(9, "\udcff")) == (9, "\udcff")  # as stored, surrogates too
    assert key_producer(id_key(9)) == (9, "")  # a prefix delete's key: every producer
    assert key_index(index_key(9, 2**40 + 1)) == (9, 2**40 + 1)
