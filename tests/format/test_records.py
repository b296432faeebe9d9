from __future__ import annotations

import pytest

from stream_format.records import (
    FILE_HEADER_SIZE,
    KIND_BYTES,
    KIND_JSON,
    CorruptRecord,
    Producer,
    encode_file_header,
    encode_record,
    iter_records,
    record_size,
)


def test_records_round_trip_with_and_without_producer():
    a = encode_record(KIND_BYTES, b"hello", 0, 111)
    b = encode_record(KIND_JSON, b'{"k":1}', 5, 222, Producer("p-1", 3, 9))
    recs = list(iter_records(a + b, 100))
    assert [r.pos for r in recs] == [100, 100 + len(a)]
    assert bytes(recs[0].payload) == b"hello" and recs[0].producer is None
    assert (recs[0].start, recs[0].stop, recs[0].timestamp_us) == (0, 5, 111)
    assert recs[1].producer == Producer("p-1", 3, 9)
    assert (recs[1].start, recs[1].stop) == (5, 6)  # a JSON message is one unit
    assert recs[1].end == 100 + len(a) + len(b)


def test_records_are_the_bytes_the_format_document_specifies():
    """Byte for byte, as the format's first writer framed them: crc32 over the rest,
    payload length, kind, flags, producer-id length, first unit, timestamp (little
    endian), then the producer's epoch, seq and id, then the payload."""
    plain = "2db00743050000000100000000000000000000006f00000000000000"
    assert encode_record(KIND_BYTES, b"hello", 0, 111).hex() == plain + b"hello".hex()
    produced = (
        "cb070179"
        "07000000"
        "02"
        "01"
        "0300"
        "0500000000000000"
        "de00000000000000"
        "0300000000000000"
        "0900000000000000" + b"p-1".hex() + b'{"k":1}'.hex()
    )
    assert encode_record(KIND_JSON, b'{"k":1}', 5, 222, Producer("p-1", 3, 9)).hex() == produced


def test_incomplete_tail_is_not_yielded():
    a = encode_record(KIND_BYTES, b"whole", 0, 1)
    b = encode_record(KIND_BYTES, b"torn-in-half", 5, 1)
    recs = list(iter_records(a + b[:-3], 0))
    assert len(recs) == 1
    assert record_size(b) == len(b)
    assert record_size(b[:10]) is None


def test_flipped_bit_fails_the_checksum():
    rec = bytearray(encode_record(KIND_BYTES, b"payload", 0, 1))
    rec[-1] ^= 0x01
    with pytest.raises(CorruptRecord):
        list(iter_records(bytes(rec), 0))


def test_file_header_size():
    assert len(encode_file_header(7)) == FILE_HEADER_SIZE == 16
