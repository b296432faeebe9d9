"""Property tests: the protocol's parsers refuse hostile input only in the ways they document."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_format.offsets import OffsetError, format_offset, parse_offset
from stream_server.protocol.headers import (
    is_true,
    non_negative_int,
    parse_expires_at,
    parse_producer,
    parse_ttl,
)
from stream_server.protocol.paths import stream_path
from stream_server.streams.errors import BadRequest, NotFound
from stream_server.streams.jsonmode import split_messages

text = st.text(max_size=200)
header_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=100)


@settings(max_examples=400)
@given(text)
def test_offsets(value):
    try:
        unit = parse_offset(value)
    except OffsetError:
        return
    if unit >= 0:
        assert format_offset(unit) == value  # only canonical tokens are accepted


@settings(max_examples=400)
@given(header_text)
def test_ttl_and_integers(value):
    for fn in (parse_ttl, lambda v: non_negative_int(v, "x")):
        try:
            n = fn(value)
        except BadRequest:
            continue
        assert n is not None and n >= 0 and str(n) == value.strip()


@settings(max_examples=300)
@given(header_text)
def test_expires_at(value):
    try:
        text_value, ts = parse_expires_at(value)
    except BadRequest:
        return
    assert isinstance(ts, float) and text_value == value.strip()


@settings(max_examples=300)
@given(
    st.one_of(st.none(), header_text),
    st.one_of(st.none(), header_text),
    st.one_of(st.none(), header_text),
)
def test_producer_headers(pid, epoch, seq):
    try:
        p = parse_producer(pid, epoch, seq)
    except BadRequest:
        return
    if p is not None:
        assert p.id.strip() and 0 <= p.epoch <= 2**53 - 1 and 0 <= p.seq <= 2**53 - 1


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_paths(raw):
    base = b"/v1/stream/"
    try:
        path = stream_path(base + raw, base, max_bytes=1024, max_segment=255)
    except (BadRequest, NotFound):
        return
    segments = path.split("/")
    assert all(s not in ("", ".", "..") for s in segments)
    assert "\x00" not in path and "\\" not in path


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_json_bodies(body):
    try:
        whole = orjson.loads(body)
    except orjson.JSONDecodeError:
        whole = BadRequest
    try:
        messages = split_messages(body, allow_empty_array=False, max_messages=1000)
    except BadRequest:
        assert whole is BadRequest or whole == []
        return
    # Accepted exactly when strict JSON, and each message is one of its values.
    expected = whole if isinstance(whole, list) else [whole]
    assert [orjson.loads(m) for m in messages] == expected


@given(st.one_of(st.none(), header_text))
def test_stream_closed_means_only_true(value):
    # Any value but "true" (in any case, around spaces) counts as absent.
    assert is_true(value) == (value is not None and value.strip().lower() == "true")
