"""Pure parsing and encoding in the protocol layer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_format.offsets import NOW, START, OffsetError, format_offset, parse_offset
from stream_server.protocol import sse
from stream_server.protocol.cursor import CURSOR_EPOCH, CURSOR_INTERVAL, next_cursor
from stream_server.protocol.headers import (
    is_true,
    parse_expires_at,
    parse_producer,
    parse_ttl,
)
from stream_server.protocol.paths import is_reserved, stream_path
from stream_server.streams.errors import BadRequest, NotFound


@given(
    st.integers(min_value=0, max_value=10**16 - 1), st.integers(min_value=0, max_value=10**16 - 1)
)
def test_offsets_sort_like_positions_and_round_trip(a, b):
    fa, fb = format_offset(a), format_offset(b)
    assert (fa < fb) == (a < b)
    assert parse_offset(fa) == a
    assert fa not in ("-1", "now")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        "1",
        "0000000000000000_000000000000001",
        "0000000000000001_0000000000000000",
        "0000000000000000_000000000000000x",
        "-2",
        "NOW",
        " 0000000000000000_0000000000000000",
    ],
)
def test_malformed_offsets_are_refused(bad):
    with pytest.raises(OffsetError):
        parse_offset(bad)


def test_sentinels():
    assert parse_offset("-1") == START
    assert parse_offset("now") == NOW
    with pytest.raises(OffsetError):
        parse_offset("now", allow_now=False)


@pytest.mark.parametrize("value", ["3600", "0", "1"])
def test_ttl_accepts_plain_decimals(value):
    assert parse_ttl(value) == int(value)


@pytest.mark.parametrize("value", ["+3600", "03600", "3600.0", "3.6e3", "-1", "", "abc", " "])
def test_ttl_refuses_everything_else(value):
    with pytest.raises(BadRequest):
        parse_ttl(value)


def test_expires_at_needs_a_time_zone():
    assert parse_expires_at("2030-01-01T00:00:00Z")[1] == pytest.approx(1893456000.0)
    assert parse_expires_at("2030-01-01T01:00:00+01:00")[1] == pytest.approx(1893456000.0)
    for bad in ["2030-01-01", "2030-01-01T00:00:00", "tomorrow", "2030-13-01T00:00:00Z"]:
        with pytest.raises(BadRequest):
            parse_expires_at(bad)


def test_stream_closed_is_true_only_for_true():
    assert is_true("true") and is_true("TRUE") and is_true("True")
    for v in [None, "false", "yes", "1", ""]:
        assert not is_true(v)


def test_producer_headers_all_or_nothing():
    assert parse_producer(None, None, None) is None
    p = parse_producer("a", "1", "2")
    assert (p.id, p.epoch, p.seq) == ("a", 1, 2)
    for args in [
        ("a", None, None),
        ("", "0", "0"),
        ("a", "-1", "0"),
        ("a", "0", "x"),
        ("a", str(2**53), "0"),
        ("a", "0", "01"),
    ]:
        with pytest.raises(BadRequest):
            parse_producer(*args)


BASE = b"/v1/stream/"


def path(raw: bytes) -> str:
    return stream_path(BASE + raw, BASE, max_bytes=1024, max_segment=255)


def test_paths_decode_and_keep_unicode():
    assert path(b"a/b/c") == "a/b/c"
    assert path(b"caf%C3%A9") == "café"


@pytest.mark.parametrize(
    "raw",
    [
        b"a/../b",
        b"..",
        b"a//b",
        b"a/./b",
        b"a%2Fb",
        b"a%2fb",
        b"a%00b",
        b"a%5Cb",
        b"a\\b",
        b"%ff%fe",
        b"a/" + b"x" * 300,
        b"x" * 1100,
    ],
)
def test_unsafe_paths_are_refused(raw):
    with pytest.raises(BadRequest):
        path(raw)


def test_empty_path_is_not_found_and_ds_is_reserved():
    with pytest.raises(NotFound):
        path(b"")
    assert is_reserved("__ds/subscriptions/x") and not is_reserved("a/__ds")


def test_cursor_moves_forward_past_the_client():
    now = CURSOR_EPOCH + 1000 * CURSOR_INTERVAL + 1
    assert next_cursor(None, now) == "1000"
    assert next_cursor("999", now) == "1000"
    assert int(next_cursor("1000", now)) > 1000
    assert int(next_cursor("5000", now)) > 5000
    assert next_cursor("garbage", now) == "1000"


def test_sse_framing():
    assert sse.data_event_text(b"a\nb") == b"event: data\ndata:a\ndata:b\n\n"
    assert sse.data_event_text(b" lead") == b"event: data\ndata:  lead\n\n"
    assert sse.control_event(b'{"x":1}') == b'event: control\ndata:{"x":1}\n\n'
