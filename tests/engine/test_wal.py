from __future__ import annotations

import pytest

from stream_format import wal
from stream_server.engine.wal import WalWriter


def _frame(lsn: int) -> bytes:
    return wal.encode_frame(
        lsn,
        [
            (wal.PUT, 1, b"key", b"value"),
            (wal.DELETE, 2, b"gone"),
            (wal.DELETE_PREFIX, 3, b"\x00\x01"),
            (wal.WRITE, 7, 16, b"data"),
        ],
    )


def test_frames_round_trip(tmp_path):
    path = tmp_path / "0000000000000001.wal"
    path.write_bytes(_frame(1) + _frame(2))
    frames = list(wal.read_frames(path, last_file=True))
    assert [f.lsn for f in frames] == [1, 2]
    kinds = [e[0] for e in frames[0].entries]
    assert kinds == [wal.PUT, wal.DELETE, wal.DELETE_PREFIX, wal.WRITE]
    assert bytes(frames[0].entries[3][3]) == b"data"
    assert frames[0].entries[0] == (wal.PUT, 1, b"key", b"value")
    assert frames[0].entries[2] == (wal.DELETE_PREFIX, 3, b"\x00\x01")


def test_torn_last_frame_is_dropped_only_at_the_end_of_the_newest_file(tmp_path):
    path = tmp_path / "0000000000000001.wal"
    data = _frame(1) + _frame(2)[:-5]
    path.write_bytes(data)
    assert [f.lsn for f in wal.read_frames(path, last_file=True)] == [1]
    with pytest.raises(wal.WalCorrupt):
        list(wal.read_frames(path, last_file=False))


def test_writer_appends_and_rotates(tmp_path):
    w = WalWriter(tmp_path, 1)
    w.append(_frame(1))
    w.sync()
    w2 = w.rotate()
    w2.append(_frame(2))
    w2.close()
    assert [p.name for p in wal.wal_files(tmp_path)] == [
        "0000000000000001.wal",
        "0000000000000002.wal",
    ]
