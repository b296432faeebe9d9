"""The webhook retry schedule: 1 s doubling to 60 s, each delay within 20% of nominal."""

from __future__ import annotations

import random

import pytest

from stream_server.subscriptions.retry import next_attempt_at, next_delay, nominal_delay


def test_nominal_delays_double_from_one_second_to_the_sixty_second_cap():
    assert [nominal_delay(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert nominal_delay(0) == nominal_delay(-3) == 1  # below the first failure counts as it
    assert nominal_delay(10**9) == 60  # no overflow for a receiver down for ages


@pytest.mark.parametrize("attempt", [1, 2, 5, 7, 100])
def test_jitter_stays_within_twenty_percent_and_spreads(attempt):
    rand = random.Random(7)
    delays = [next_delay(attempt, rand) for _ in range(2000)]
    nominal = nominal_delay(attempt)
    assert all(0.8 * nominal <= d <= 1.2 * nominal for d in delays)
    # Both halves of the band are used: subscriptions that failed together spread out.
    assert min(delays) < 0.85 * nominal and max(delays) > 1.15 * nominal


def test_a_seeded_random_gives_a_reproducible_schedule():
    a = [next_delay(n, random.Random(1)) for n in range(1, 8)]
    b = [next_delay(n, random.Random(1)) for n in range(1, 8)]
    assert a == b
    assert next_attempt_at(3, 1000.0, random.Random(1)) == 1000.0 + next_delay(3, random.Random(1))


def test_the_default_random_source_works():
    assert 0.8 <= next_delay(1) <= 1.2
