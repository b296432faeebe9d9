"""The replication wire format (``replication/peers/wire.py``): what one end encodes the other
decodes, whole or arriving in pieces. In-process, no peers."""

from __future__ import annotations

from stream_server.replication.peers import wire


def test_stream_messages_are_taken_whole_as_they_arrive() -> None:
    """Bytes arrive in any pieces: each take returns the messages whole so far (the
    frames, the highest commit point and echo) and keeps the rest for later."""
    sent = (
        wire.message(3, 7, 5, 100, b"frame seven")
        + wire.message(0, 0, 7, 120)  # the commit point alone
        + wire.message(3, 8, 6, 110, b"eight")
    )
    buffer = bytearray()
    taken: list[wire.Shipped] = []
    commits: list[int] = []
    echoes: list[int] = []
    for i in range(0, len(sent), 10):
        buffer += sent[i : i + 10]
        got = wire.take_messages(buffer)
        if got is not None:
            frames, commit, echo = got
            taken += frames
            commits.append(commit)
            echoes.append(echo)
    assert taken == [(3, 7, b"frame seven"), (3, 8, b"eight")]
    assert max(commits) == 7 and max(echoes) == 120
    assert not buffer
    assert wire.take_messages(bytearray(sent[: wire.MESSAGE.size - 1])) is None


def test_the_newest_whole_acknowledgement_is_taken() -> None:
    buffer = bytearray(wire.ack(3, 7, 5, 100) + wire.ack(3, 9, 6, 130))
    partial = wire.ack(3, 10, 6, 140)
    buffer += partial[:5]
    assert wire.take_acks(buffer) == (3, 9, 6, 130)
    assert bytes(buffer) == partial[:5]  # the piece of the next one stays
    assert wire.take_acks(buffer) is None
    buffer += partial[5:]
    assert wire.take_acks(buffer) == (3, 10, 6, 140)


def test_the_one_stream_version_offered_is_the_one_asked_for() -> None:
    assert wire.VERSIONS == {wire.UPGRADE: 2}


def test_the_http_server_takes_over_exactly_the_streams_upgrades() -> None:
    """``http_limits`` hands a connection to the app only for these upgrades."""
    from stream_server.http_limits import UPGRADES

    assert {u.decode() for u in UPGRADES} == set(wire.VERSIONS)
