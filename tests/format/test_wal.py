"""WAL files: the header (format 2), the frames, and format 1's headerless files."""

from __future__ import annotations

import struct

import pytest

from stream_format import wal
from stream_format.layout import FormatError
from stream_format.records import crc32
from stream_server.engine.wal_writer import WalWriter

NAME = "0000000000000001.wal"


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


def _header(magic: bytes = wal.FILE_MAGIC, version: int = wal.WAL_VERSION, number: int = 1):
    head = magic + struct.pack("<HQ", version, number)
    return head + struct.pack("<I", crc32(head))


def test_the_header_bytes_are_the_documented_ones():
    head = wal.encode_header(1)
    assert len(head) == wal.HEADER_SIZE == 20
    assert head[:8] == bytes.fromhex("4453 57414c 00 0200".replace(" ", ""))
    assert head[8:16] == (1).to_bytes(8, "little")
    assert head[16:] == crc32(head[:16]).to_bytes(4, "little")
    assert head == _header()


def test_frames_round_trip(tmp_path):
    path = tmp_path / NAME
    path.write_bytes(wal.encode_header(1) + _frame(1) + _frame(2))
    frames = list(wal.read_frames(path, last_file=True))
    assert [f.lsn for f in frames] == [1, 2]
    kinds = [e[0] for e in frames[0].entries]
    assert kinds == [wal.PUT, wal.DELETE, wal.DELETE_PREFIX, wal.WRITE]
    assert bytes(frames[0].entries[3][3]) == b"data"
    assert frames[0].entries[0] == (wal.PUT, 1, b"key", b"value")
    assert frames[0].entries[2] == (wal.DELETE_PREFIX, 3, b"\x00\x01")


def test_format_1_files_have_no_header_and_are_read_in_format_1_directories(tmp_path):
    path = tmp_path / NAME
    path.write_bytes(_frame(1) + _frame(2))
    frames = list(wal.read_frames(path, last_file=True, headerless=True))
    assert [f.lsn for f in frames] == [1, 2]
    wal.check_file(path, headerless=True)
    # In a format-2 directory the same file is refused by name, never dropped as torn.
    for last in (True, False):
        with pytest.raises(wal.WalCorrupt, match=f"{NAME}: a headerless WAL file"):
            list(wal.read_frames(path, last_file=last))
    # And a file with a header is refused in a format-1 directory.
    path.write_bytes(wal.encode_header(1) + _frame(1))
    with pytest.raises(wal.WalCorrupt, match="format-2 header in a format-1 directory"):
        list(wal.read_frames(path, last_file=True, headerless=True))


def test_torn_last_frame_is_dropped_only_at_the_end_of_the_newest_file(tmp_path):
    path = tmp_path / NAME
    path.write_bytes(wal.encode_header(1) + _frame(1) + _frame(2)[:-5])
    assert [f.lsn for f in wal.read_frames(path, last_file=True)] == [1]
    with pytest.raises(wal.WalCorrupt):
        list(wal.read_frames(path, last_file=False))


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (_header(magic=b"NOTWAL") + _frame(1), "not a WAL file"),
        (_header(version=3) + _frame(1), "WAL file version 3 is newer than"),
        (_header(version=1) + _frame(1), "WAL file version 1 is not"),
        (_header(number=2) + _frame(1), "names WAL file 2, not 1"),
        (_header()[:-1] + b"\xff" + _frame(1), "fails its checksum"),
        (b"XY", "incomplete WAL file header"),
        (bytes(wal.HEADER_SIZE) + _frame(1), "never written"),
    ],
)
def test_a_file_recovery_cannot_replay_is_refused_by_name(tmp_path, content, error):
    path = tmp_path / NAME
    path.write_bytes(content)
    for last in (True, False):  # never silently skipped, even as the newest file
        with pytest.raises(wal.WalCorrupt, match=error) as info:
            list(wal.read_frames(path, last_file=last))
        assert str(path) in str(info.value)
    with pytest.raises(wal.WalCorrupt, match=error):
        wal.check_file(path)  # what the server checks before it starts
    assert isinstance(info.value, FormatError)  # the server's start-up reports it


@pytest.mark.parametrize(
    "content",
    [b"", wal.encode_header(1)[:7], bytes(5), bytes(wal.HEADER_SIZE), bytes(4096)],
    ids=["empty", "prefix", "short-zeros", "zero-header", "zero-block"],
)
def test_a_header_that_never_reached_the_disk_means_an_empty_file(tmp_path, content):
    """The writer flushes a header before the first frame: a crash right after the
    create can leave the file empty, short or zero-filled, and nothing was in it."""
    path = tmp_path / NAME
    path.write_bytes(content)
    for last in (True, False):
        assert list(wal.read_frames(path, last_file=last)) == []
    wal.check_file(path)


def test_writer_writes_the_header_then_appends_and_rotates(tmp_path):
    w = WalWriter(tmp_path, 1)
    assert w.size == wal.HEADER_SIZE
    w.append(_frame(1))
    w.sync()
    w2 = w.rotate()
    w2.append(_frame(2))
    w2.close()
    assert [p.name for p in wal.wal_files(tmp_path)] == [NAME, "0000000000000002.wal"]
    assert (tmp_path / "0000000000000002.wal").read_bytes()[:20] == wal.encode_header(2)
    assert [f.lsn for f in wal.read_frames(tmp_path / NAME, last_file=False)] == [1]
    with pytest.raises(FileExistsError):
        WalWriter(tmp_path, 1)


def test_a_format_1_frame_packed_by_the_spec_still_decodes(tmp_path):
    """Frames are the same bytes in formats 1 and 2: packed here from the table in
    docs/storage-format.md, not by the codec, so a codec change that would misread old
    directories' WAL files fails here."""
    body = (
        struct.pack("<BBII", 1, 2, 3, 4) + b"key" + b"valu"  # PUT db 2
        + struct.pack("<BQQI", 4, 9, 16, 2) + b"hi"  # WRITE stream 9 at 16
        + struct.pack("<BBII", 3, 4, 1, 0) + b"\x05"  # DELETE_PREFIX db 4
    )  # fmt: skip
    frame = struct.pack("<IIIQ", 0x46574453, len(body), crc32(body), 42) + body
    path = tmp_path / NAME
    path.write_bytes(frame)
    (got,) = wal.read_frames(path, last_file=False, headerless=True)
    assert got.lsn == 42 and got.end == len(frame)
    assert got.entries[0] == (wal.PUT, 2, b"key", b"valu")
    assert got.entries[1][:3] == (wal.WRITE, 9, 16) and bytes(got.entries[1][3]) == b"hi"
    assert got.entries[2] == (wal.DELETE_PREFIX, 4, b"\x05")
    path.write_bytes(wal.encode_header(1) + frame)  # and after a format-2 header
    assert [f.lsn for f in wal.read_frames(path, last_file=False)] == [42]


def test_a_format_3_records_entry_packed_by_the_spec_decodes(tmp_path):
    """Format 3's records database (number 5): its entries are PUT and DELETE in the
    same layout, packed here from the table, key = space, 0x00, key."""
    body = (
        struct.pack("<BBII", 1, 5, 6, 2) + b"subs\x00a" + b"{}"  # PUT records
        + struct.pack("<BBII", 2, 5, 6, 0) + b"subs\x00b"  # DELETE records
    )  # fmt: skip
    frame = struct.pack("<IIIQ", 0x46574453, len(body), crc32(body), 7) + body
    path = tmp_path / NAME
    path.write_bytes(wal.encode_header(1) + frame)
    (got,) = wal.read_frames(path, last_file=True)
    assert got.entries == [(wal.PUT, 5, b"subs\x00a", b"{}"), (wal.DELETE, 5, b"subs\x00b")]


def test_a_frame_naming_a_database_this_program_does_not_know_stops_recovery(tmp_path):
    """A whole, checksummed frame of a newer writer: refused by name, never half
    applied or dropped as torn, even at the end of the newest file."""
    path = tmp_path / NAME
    path.write_bytes(
        wal.encode_header(1) + _frame(1) + wal.encode_frame(2, [(wal.PUT, 7, b"k", b"v")])
    )
    for last in (True, False):
        with pytest.raises(wal.WalCorrupt, match=f"{NAME}: frame at .*unknown database number 7"):
            list(wal.read_frames(path, last_file=last))


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (bytes([9]) + bytes(20), "unknown WAL entry kind 9"),
        (struct.pack("<BBII", 1, 1, 3, 50) + b"keyvalue", "runs past its frame"),
        (struct.pack("<BQQI", 4, 1, 0, 99) + b"short", "runs past its frame"),
        (bytes([1, 1, 0]), "runs past its frame"),
    ],
)
def test_a_checksummed_frame_that_does_not_decode_is_refused_by_name(tmp_path, body, error):
    frame = struct.pack("<IIIQ", 0x46574453, len(body), crc32(body), 1) + body
    path = tmp_path / NAME
    path.write_bytes(wal.encode_header(1) + frame)
    with pytest.raises(wal.WalCorrupt, match=f"{NAME}: frame at 20: .*{error}"):
        list(wal.read_frames(path, last_file=True))
