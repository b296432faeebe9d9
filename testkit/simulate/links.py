"""The simulated network: every message between two nodes (members, clients and the
Kubernetes API, ``"api"``) is delayed, and may be dropped or overtaken.

Delays are drawn from the run's random generator: mostly a few milliseconds, now
and then a tenth of a second or more, so a later message often arrives first
(reordering, as retransmits and separate connections give). A pair of nodes can
be cut for a while (a partition, one-way cuts included) or lose a fraction of
its messages (a flaky link), and a fraction of all messages can be lost. A request is one message there and one back:
either can be lost, so an answer that never came says nothing about whether
the request arrived, the case the Lease's read-back exists for.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from testkit.simulate.clock import VirtualLoop

Reply = Callable[[object], None]


class Network:
    def __init__(self, rng: random.Random, loop: VirtualLoop) -> None:
        self.rng = rng
        self.loop = loop
        self.loss = 0.0  # the fraction of messages dropped now
        self._cut: dict[tuple[str, str], float] = {}  # (from, to) -> cut until (virtual s)
        self._flaky: dict[tuple[str, str], tuple[float, float]] = {}  # -> (loss, until)
        # Links whose messages arrive in the order sent (one connection), and the time the
        # last message sent on each arrives.
        self.ordered: set[tuple[str, str]] = set()
        self._last: dict[tuple[str, str], float] = {}
        self.sent = 0
        self.dropped = 0

    def cut(self, a: str, b: str, until: float, *, both: bool = True) -> None:
        """Drop every message from ``a`` to ``b`` (and back, with ``both``) until ``until``."""
        self._cut[(a, b)] = max(self._cut.get((a, b), 0.0), until)
        if both:
            self._cut[(b, a)] = max(self._cut.get((b, a), 0.0), until)

    def flaky(self, a: str, b: str, loss: float, until: float) -> None:
        """Lose ``loss`` of the messages between ``a`` and ``b``, both ways, until ``until``."""
        self._flaky[(a, b)] = self._flaky[(b, a)] = (loss, until)

    def heal(self) -> None:
        self._cut.clear()
        self._flaky.clear()
        self.loss = 0.0

    def delay(self) -> float:
        if self.rng.random() < 0.05:
            return self.rng.uniform(0.05, 0.4)  # a slow path: overtaken by later messages
        return self.rng.uniform(0.0005, 0.008)

    def send(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        """Deliver (call ``deliver``) after a delay, unless the message is lost: in true
        time, the sender's clock and pauses aside (``VirtualLoop.call_true``)."""
        self.sent += 1
        now = self.loop.now
        loss, until = self._flaky.get((src, dst), (0.0, 0.0))
        lost = self.rng.random() < max(self.loss, loss if until > now else 0.0)
        delay = self.delay()
        if lost or self._cut.get((src, dst), 0.0) > now:
            self.dropped += 1
            return
        if (src, dst) in self.ordered:
            delay = max(delay, self._last.get((src, dst), 0.0) - now)
            self._last[(src, dst)] = now + delay
        self.loop.call_true(delay, deliver)

    def request(
        self, src: str, dst: str, arrive: Callable[[Reply], None]
    ) -> asyncio.Future[object]:
        """A request from ``src``: ``arrive(reply)`` runs at ``dst`` when it gets there, and
        whatever it replies travels back. The future resolves with the reply; it never
        resolves when either way was lost (the caller times out)."""
        answer: asyncio.Future[object] = self.loop.create_future()

        def resolve(value: object) -> None:
            if not answer.done():
                answer.set_result(value)

        def reply(value: object) -> None:
            self.send(dst, src, lambda: resolve(value))

        self.send(src, dst, lambda: arrive(reply))
        return answer
