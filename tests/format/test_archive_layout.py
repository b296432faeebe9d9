"""The archive's layout in the format package: locations, names, frames objects,
term histories and manifests; every kind of damage named, never replayed."""

from __future__ import annotations

import pytest

from stream_format import archive as arc
from stream_format import wal


def _frames(first: int, count: int) -> list[arc.ArchivedFrame]:
    return [
        arc.ArchivedFrame(
            lsn, 1_700_000_000_000_000 + lsn, wal.encode_frame(lsn, [(wal.WRITE, 3, 0, b"x" * lsn)])
        )
        for lsn in range(first, first + count)
    ]


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my.bucket-1/a/b/", "my.bucket-1", "a/b/"),
        ("s3://abc/x", "abc", "x/"),
    ],
)
def test_a_location_is_a_bucket_and_a_prefix(url, bucket, prefix):
    loc = arc.ArchiveLocation.parse(url)
    assert (loc.bucket, loc.prefix) == (bucket, prefix)
    assert loc.key("wal/x") == prefix + "wal/x"
    assert arc.ArchiveLocation.parse(loc.url) == loc


@pytest.mark.parametrize(
    "url",
    ["", "bucket/x", "http://bucket", "s3://", "s3://ab", "s3://Upper", "s3://b_x", "s3://abc//x"],
)
def test_a_bad_location_is_refused_naming_it(url):
    with pytest.raises(ValueError, match=r"s3://|empty path"):
        arc.ArchiveLocation.parse(url)


def test_names_sort_by_term_then_lsn():
    names = [arc.wal_name(t, lsn) for t, lsn in [(2, 1), (1, 300), (1, 2), (10, 0), (1, 0x10)]]
    assert sorted(names) == [
        arc.wal_name(t, n) for t, n in [(1, 2), (1, 0x10), (1, 300), (2, 1), (10, 0)]
    ]
    assert arc.parse_wal_name(arc.wal_name(7, 12345)) == (7, 12345)
    with pytest.raises(arc.ArchiveDamaged, match="wal/zz"):
        arc.parse_wal_name("wal/zz")
    assert arc.part_name("b1", 3) == "backups/b1/part-000003"
    assert arc.manifest_name("b1") == "backups/b1/manifest.json"


def test_a_frames_object_round_trips():
    frames = _frames(5, 4)
    data = arc.encode_frames_object(3, frames)
    assert arc.decode_header("o", data[: arc.HEADER_SIZE])[:4] == (3, 5, 8, 4)
    obj = arc.decode_frames_object("o", data)
    assert (obj.term, obj.first_lsn, obj.last_lsn) == (3, 5, 8)
    assert obj.frames == frames


def test_frames_must_be_consecutive():
    frames = _frames(1, 3)
    with pytest.raises(ValueError, match="consecutive"):
        arc.encode_frames_object(0, [frames[0], frames[2]])
    with pytest.raises(ValueError):
        arc.encode_frames_object(0, [])


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:-1],  # truncated
        lambda d: d[: arc.HEADER_SIZE - 1],  # a header cut short
        lambda d: d[:-3] + bytes([d[-3] ^ 1]) + d[-2:],  # a frame's byte altered
        lambda d: d[:10] + bytes([d[10] ^ 1]) + d[11:],  # a header byte altered
        lambda d: b"NOTOURS!" + d[8:],  # not a frames object
        lambda d: d + b"\x00",  # bytes after the frames
    ],
)
def test_any_damage_is_found_and_names_the_object(damage):
    data = arc.encode_frames_object(1, _frames(1, 3))
    with pytest.raises(arc.ArchiveDamaged, match="wal/0001"):
        arc.decode_frames_object("wal/0001", damage(data))


def test_an_index_that_lies_about_a_frame_is_found():
    """Each frame's own checksum and lsn are checked, not only the object's: an object
    whose outer checksum was recomputed over a swapped frame is still refused."""
    good = _frames(1, 2)
    swapped = [good[0], arc.ArchivedFrame(2, good[1].time_us, good[0].frame)]
    data = arc.encode_frames_object(1, swapped)
    with pytest.raises(arc.ArchiveDamaged, match="frame 2"):
        arc.decode_frames_object("o", data)


def test_histories_round_trip_and_give_each_terms_range():
    history = [(1, 1), (2, 40), (5, 41)]
    assert arc.decode_history("h", arc.encode_history(5, history)) == history
    assert arc.history_ranges(history, 100) == [(1, 1, 39), (2, 40, 40), (5, 41, 100)]
    assert arc.history_ranges(history, 39) == [(1, 1, 39)]
    with pytest.raises(ValueError):
        arc.encode_history(4, history)
    with pytest.raises(arc.ArchiveDamaged, match="h2"):
        arc.decode_history("h2", b'{"term": 3, "history": [[1, 1]]}')
    with pytest.raises(arc.ArchiveDamaged, match="h3"):
        arc.decode_history("h3", b"{")


def test_manifests_are_checked():
    doc = {
        "id": "x",
        "term": 1,
        "start_lsn": 4,
        "end_lsn": 4,
        "time": "2026-11-26T00:00:00Z",
        "parts": [],
        "files": [],
    }
    assert arc.decode_manifest("m", arc.encode_manifest(doc))["start_lsn"] == 4
    with pytest.raises(arc.ArchiveDamaged, match="without files"):
        arc.decode_manifest(
            "m", arc.encode_manifest({k: v for k, v in doc.items() if k != "files"})
        )
    with pytest.raises(arc.ArchiveDamaged, match="format 9"):
        arc.decode_manifest("m", arc.encode_manifest(doc).replace(b'"format": 1', b'"format": 9'))


def test_a_backup_id_sorts_by_time_and_gives_its_time_back():
    first, later = arc.backup_id(1_764_000_000.9, 0x20), arc.backup_id(1_764_000_061, 0x5)
    assert first == "20251124T160000Z-0000000000000020" and first < later
    assert arc.backup_id_time(first) == 1_764_000_000
    with pytest.raises(ValueError):
        arc.backup_id_time("latest-0001")
