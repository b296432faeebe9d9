"""A member's standby side: ``follower.Follower``'s loop on simulated storage.

The rules are the follower's own: its methods that decide (which frames of an
answer follow our position, whether an answer's term may be applied, whether
the primary we follow is still ours to follow, how long to wait for news) are
borrowed from the class, and what a standby acknowledges is
``rules.acknowledged``. What differs is the transport (one request over the
simulated network, ``World.stream_round``: a stream's next messages as the
answer to its acknowledgement, echoing its stamp as a stream's message does)
and the writer: the frames are written, and the acknowledgement waits for
their flush only while ``rules.acknowledged`` says the flushed position is
what may be acknowledged (always, unless a mutant says otherwise).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from stream_server.replication import rules
from stream_server.replication.primary.shipping import Refusal
from stream_server.replication.standby.receiver import RECOPY, Follower, unless_stale
from testkit.simulate.storage import Storage

if TYPE_CHECKING:
    from testkit.simulate.members import Member


class _Written:
    """``hooks.durable`` as ``Follower._in_order`` reads it: the last frame written."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def durable(self) -> rules.Position:
        return self.storage.written


class Standby:
    # The follower's own decisions (module doc), run on this object's fields.
    _in_order = Follower._in_order
    _answer_term = Follower._answer_term
    _stale = Follower._stale
    _news = Follower._news

    def __init__(self, member: Member) -> None:
        self.member = member
        self.roles = member.roles
        self.retry_period = member.settings.retry_period
        self.hooks = _Written(member.storage)
        self.following = False
        self.applying = asyncio.Lock()
        self.highest_term = 0
        self.commit = 0  # the primary's last announced commit point
        self.problem: str | None = None
        self.received: rules.Position = (0, 0)

    async def run(self) -> None:
        """``Follower._run``, one request and answer at a time."""
        while True:
            state = self.roles.state
            if not self.following or self.roles.is_primary or not state.primary_url:
                await self._news()
                continue
            try:
                await self._round(state.primary_url, state.term)
            except (TimeoutError, ValueError) as exc:
                self.problem = f"following {state.primary_url} failed: {exc!r}"
                await asyncio.sleep(self.retry_period)

    async def _round(self, primary: str, term: int) -> None:
        m = self.member
        stamp = m.freshness.stamp()  # the answer echoes it: current as of this or later
        after_term, after_lsn = rules.acknowledged(m.storage.durable, m.storage.written)
        params = (term, after_term, after_lsn, self.commit)
        request = m.world.stream_round(m, primary, params, stamp)
        r = await unless_stale(request, lambda: self._stale(primary, term), self.retry_period)
        if r is None:
            return
        if isinstance(r, Refusal):
            await self._refused(r.status, r.body, primary, term)
            return
        answer_term, shipped, commit, echo = r
        if not self._answer_term(answer_term, term):
            await self._news()
            return
        self.problem = None
        first = len(m.storage.frames) + 1
        frames = self._in_order(shipped)
        await self._apply([(t, first + i, f) for i, (t, f) in enumerate(frames)], commit)
        m.freshness.heard(echo, commit, m.published)

    async def _apply(self, frames: list[tuple[int, int, bytes]], commit: int) -> None:
        """``Follower._apply`` and ``_finish``: written, flushed before the next
        acknowledgement unless ``rules.acknowledged`` counts unflushed frames, then
        visible to readers up to the commit point."""
        m = self.member
        self.commit = max(self.commit, commit)
        if frames:
            async with self.applying:
                if not self.following:
                    return
                m.storage.write(frames)
                flush = m.spawn(m.storage.flush(m.world.flush_delay()))
                if rules.acknowledged(m.storage.durable, m.storage.written) < m.storage.written:
                    await flush
                for frame in frames:
                    m.shipper.add(*frame)
        m.published = max(m.published, min(self.commit, len(m.storage.frames)))
        m.freshness.visible(m.published)

    async def _refused(self, status: int, body: bytes, primary: str, term: int) -> None:
        """``Follower._refused``: 409 says why (wrong term, or re-copy); else an error."""
        if status != 409:
            raise ValueError(f"the primary answered {status}: {body[:200]!r}")
        answer = json.loads(body)
        reason = answer.get("error", "refused")
        self.problem = reason
        if reason in RECOPY:
            async with self.applying:
                pass
            await self.member.world.recopy(self.member, primary)
        if int(answer.get("term") or 0) > term:
            self.roles.wake()
        await self._news()
