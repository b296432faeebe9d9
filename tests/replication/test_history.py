"""The history checker (testkit.history) finds each kind of violation it promises to find.

A checker that passes everything proves nothing: each test below builds a
small history with one known fault and expects exactly that fault reported.
"""

from __future__ import annotations

import pytest

from testkit.history import History, Seen, check, message, parse


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


def _at(op, invoked: float, completed: float) -> None:
    op.invoked, op.completed = invoked, completed


def test_a_read_that_says_up_to_date_but_misses_an_old_acknowledgement_is_found():
    h = History()
    for i, token in enumerate(["w0.0", "w0.1"]):
        op = h.invoke("w0", "append", "s", token=token, server="ds-0")
        h.complete(op, "ok")
        _at(op, 10.0 + i, 10.5 + i)  # acknowledged at 10.5 and 11.5
    final = {"s": message("w0.0") + message("w0.1")}
    for sent in (12.0, 17.0):  # 0.5 s after w0.1's ack (within 5 s), then 5.5 s after
        op = h.invoke("r0", "read", "s", server="ds-1")
        h.complete(op, "ok", "200", message("w0.0"))
        op.fresh_at = sent
    report = check(h, final, bound=5.0)
    assert len(report.stale_reads) == 1 and "5.50 s" in report.stale_reads[0], report.summary()
    assert report.fresh_reads == 2 and report.staleness == pytest.approx(5.5)
    assert check(h, final, bound=6.0).ok  # a looser bound allows it
    assert check(h, final).ok  # no bound: reads are only checked for being a prefix


def test_a_read_that_does_not_say_up_to_date_is_never_stale():
    h = History()
    op = h.invoke("w0", "append", "s", token="w0.0", server="ds-0")
    h.complete(op, "ok")
    _at(op, 1.0, 1.0)
    read(h, b"")  # fresh_at None: the server did not claim it was up to date
    assert check(h, {"s": message("w0.0")}, bound=0.1).ok


def test_an_acknowledgement_after_a_higher_term_primary_was_seen_is_found():
    h = History()
    h.seen.append(Seen("ds-0", 0.0, 0.1, "primary", 1))
    h.seen.append(Seen("ds-1", 5.0, 5.1, "primary", 2))
    tokens = []
    for i, (server, sent) in enumerate([("ds-0", 1.0), ("ds-0", 6.0), ("ds-1", 6.0)]):
        op = h.invoke("w0", "append", "s", token=f"w0.{i}", server=server)
        h.complete(op, "ok")
        _at(op, sent, sent + 0.1)
        tokens.append(op.token)
    final = {"s": b"".join(message(t) for t in tokens)}
    report = check(h, final)
    assert (
        len(report.deposed_acks) == 1
        and "w0.1 acknowledged by ds-0 (term 1)" in (report.deposed_acks[0])
    ), report.summary()
    h.ops[1].term = 3  # its answer named a term above ds-1's: a later election, not a deposed ack
    assert check(h, final).ok


def test_a_new_primarys_acks_before_the_monitor_saw_it_are_of_the_term_it_is_seen_at():
    """Elected at term 2 and acknowledging before the monitor's next poll: its first acks
    are term 2's (a replica acknowledges only as primary), not a deposed term 0's. A
    replica seen primary only at a term below one seen earlier is still caught."""
    h = History()
    h.seen.append(Seen("ds-0", 0.0, 0.1, "primary", 1))
    h.seen.append(Seen("ds-2", 7.0, 7.1, "primary", 2))  # polled after its first acks
    op = h.invoke("w0", "append", "s", token="w0.0", server="ds-2")
    h.complete(op, "ok")
    _at(op, 6.0, 6.1)
    assert check(h, {"s": message("w0.0")}).ok
    h.seen.append(Seen("ds-1", 2.0, 2.1, "primary", 3))  # a higher term seen before it
    report = check(h, {"s": message("w0.0")})
    assert len(report.deposed_acks) == 1 and "ds-2 (term 2)" in report.deposed_acks[0]


def test_a_replica_elected_again_acks_at_its_new_term_not_its_old_one():
    """ds-0 was primary at term 1, then seen a standby; ds-1 was primary at term 2; ds-0,
    elected at term 3, acknowledges before the monitor's next poll sees it primary. The
    ack is term 3's, not a deposed term 1's. Without the standby sighting between, the
    same ack stays one of term 1: after ds-1 was seen primary, a deposed ack."""
    h = History()
    h.seen.append(Seen("ds-0", 0.0, 0.1, "primary", 1))
    h.seen.append(Seen("ds-1", 2.0, 2.1, "primary", 2))
    h.seen.append(Seen("ds-0", 2.9, 3.0, "standby", 2))
    h.seen.append(Seen("ds-0", 3.4, 3.5, "primary", 3))
    op = h.invoke("w0", "append", "s", token="w0.0", server="ds-0")
    h.complete(op, "ok")
    _at(op, 3.1, 3.3)
    assert check(h, {"s": message("w0.0")}).ok
    del h.seen[2]
    report = check(h, {"s": message("w0.0")})
    assert len(report.deposed_acks) == 1 and "ds-0 (term 1)" in report.deposed_acks[0]


def test_the_longest_pause_between_acknowledgements_is_measured():
    h = History()
    for i, done in enumerate([1.0, 1.5, 4.0]):
        op = h.invoke("w0", "append", "s", token=f"w0.{i}", server="ds-0")
        h.complete(op, "ok")
        _at(op, done - 0.1, done)
    assert check(h, {"s": b"".join(message(f"w0.{i}") for i in range(3))}).pause == 2.5
