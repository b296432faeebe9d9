"""The history checker (testkit.history) finds each kind of violation it promises to find.

A checker that passes everything proves nothing: each test below builds a
small history with one known fault and expects exactly that fault reported.
"""

from __future__ import annotations

import pytest

from testkit.history import History, check, message, parse


def append(h: History, process: str, token: str, outcome: str, stream: str = "s") -> None:
    op = h.invoke(process, "append", stream, token=token, server="ds-0")
    h.complete(op, outcome)  # type: ignore[arg-type]


def read(h: History, value: bytes, stream: str = "s") -> None:
    op = h.invoke("reader", "read", stream, server="ds-1")
    h.complete(op, "ok", "200", value)


def test_a_clean_history_passes():
    h = History()
    append(h, "w0", "w0.0", "ok")
    append(h, "w0", "w0.1", "info")  # unknown, and it landed
    append(h, "w0", "w0.2", "info")  # unknown, and it did not
    append(h, "p0", "p0.0", "info")
    append(h, "p0", "p0.0", "ok")  # a producer's retry of the same token
    append(h, "w1", "w1.0", "fail")
    read(h, message("w0.0"))
    final = {"s": message("w0.0") + message("p0.0") + message("w0.1", 3)}
    report = check(h, final)
    assert report.ok, report.summary()
    assert (report.acknowledged, report.unknown_landed, report.unknown_lost) == (2, 1, 1)
    assert report.reads == 1


def test_a_lost_acknowledged_append_is_found():
    h = History()
    append(h, "w0", "w0.0", "ok")
    append(h, "w0", "w0.1", "ok")
    report = check(h, {"s": message("w0.0")})
    assert report.lost == ["s: w0.1"] and not report.ok


def test_a_duplicated_append_is_found():
    h = History()
    append(h, "p0", "p0.0", "info")
    append(h, "p0", "p0.0", "ok")
    report = check(h, {"s": message("p0.0") + message("p0.0")})
    assert report.duplicated == ["s: p0.0 x2"]


def test_a_refused_or_never_sent_append_that_is_present_is_found():
    h = History()
    append(h, "w0", "w0.0", "fail")
    report = check(h, {"s": message("w0.0") + message("ghost.1")})
    assert report.unexpected == ["s: w0.0 (refused, yet present)", "s: ghost.1 (never sent)"]


def test_a_client_whose_writes_landed_out_of_order_is_found():
    h = History()
    append(h, "w0", "w0.0", "ok")
    append(h, "w0", "w0.1", "ok")
    report = check(h, {"s": message("w0.1") + message("w0.0")})
    assert report.reordered == ["s: client w0"]


def test_a_read_of_data_later_rolled_back_is_found():
    h = History()
    append(h, "w0", "w0.0", "ok")
    append(h, "w0", "w0.1", "info")
    read(h, message("w0.0") + message("w0.1"))  # saw w0.1, which the final stream lacks
    report = check(h, {"s": message("w0.0")})
    assert len(report.unstable_reads) == 1 and not report.lost


def test_garbage_in_a_stream_is_found():
    h = History()
    append(h, "w0", "w0.0", "ok")
    report = check(h, {"s": message("w0.0") + b"<w0.1|xx"})
    assert report.garbage and "torn" in report.garbage[0]


def test_messages_round_trip_and_bad_tokens_are_refused():
    assert parse(message("a.1", 2) + message("b:2")) == ["a.1", "b:2"]
    with pytest.raises(ValueError, match="token"):
        message("a|b")
