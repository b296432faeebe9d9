"""Which follower positions the primary serves, from its term history (KIP-101):
a follower holding frames the primary never had is told it diverged, one
behind the frames the primary still holds is told to re-copy, and a stream
under another term is refused (``Shipper.refusal``). A primary past its renew
deadline, or not yet primary in the Lease's term, still serves, but vouches
for nothing: its stream echoes no stamp, so no standby's reads become current
by it (Reads, in docs/replication.md; the echo itself: ``test_freshness.py``)."""

from __future__ import annotations

import json

from stream_server.engine.replica import ReplicaHooks
from stream_server.replication.lease.kube_lease import LeaseClient
from stream_server.replication.lease.roles import RoleConfig, RoleLoop
from stream_server.replication.primary.shipping import Refusal, Shipper


def primary_at(
    lsn: int, terms: list[tuple[int, int]], ring_from: int, now: list[float] | None = None
) -> Shipper:
    clock = now if now is not None else [0.0]  # renewed at 0: it may acknowledge until 0.4
    roles = RoleLoop(
        LeaseClient("default/unused", "http://127.0.0.1:9"),  # never called here
        RoleConfig("p", "http://p", lease_duration=3, renew_deadline=0.4, retry_period=0.1),
        clock=lambda: clock[0],
    )
    roles.state.role, roles.state.term = "primary", terms[-1][0]
    hooks = ReplicaHooks()
    hooks.terms, hooks.durable = terms, (terms[-1][0], lsn)
    shipper = Shipper(roles, hooks, quorum=2, preferred=False, wait=1.0, renew_deadline=0.4)
    shipper.became_primary(terms[-1][0])
    for n in range(ring_from, lsn + 1):
        shipper.ring.append((terms[-1][0], n, b"frame"))
    return shipper


def error(refused: Refusal | None) -> dict[str, object]:
    assert refused is not None and refused.status == 409
    body: dict[str, object] = json.loads(refused.body)
    return body


def test_a_follower_on_the_history_is_served() -> None:
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30)
    assert shipper.refusal(3, 1, 41) is None  # the last frame of term 1 is 41
    assert shipper.vouching and shipper.echoing


def test_a_primary_past_its_renew_deadline_vouches_for_nothing() -> None:
    now = [0.0]
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30, now=now)
    now[0] = 0.4
    assert shipper.refusal(3, 3, 60) is None
    assert not shipper.vouching and not shipper.echoing


def test_a_primary_that_has_not_taken_up_its_term_vouches_for_nothing() -> None:
    # Elected (the role loop's state), but the service has not yet made it primary: its
    # commit point is not yet everything it holds, so it cannot vouch for a standby.
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30)
    shipper.roles.state.term = 4
    assert shipper.refusal(4, 3, 60) is None
    assert not shipper.vouching and not shipper.echoing


def test_frames_of_a_term_past_its_end_here_diverged() -> None:
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30)
    # A deposed term-1 primary wrote 42..45.
    assert error(shipper.refusal(3, 1, 45)) == {"error": "diverged", "term": 3, "truncate_to": 41}


def test_a_term_the_primary_never_saw_diverged() -> None:
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30)
    assert error(shipper.refusal(3, 2, 44)) == {"error": "diverged", "term": 3, "truncate_to": None}


def test_a_follower_behind_the_frames_held_must_recopy() -> None:
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30)
    assert error(shipper.refusal(3, 1, 10)) == {"error": "too far behind: re-copy", "term": 3}


def test_a_stream_under_another_term_is_refused() -> None:
    shipper = primary_at(60, [(1, 1), (3, 42)], ring_from=30)
    assert error(shipper.refusal(2, 1, 41)) == {
        "error": "wrong term",
        "term": 3,
        "primary": shipper.roles.state.primary_url,
    }
