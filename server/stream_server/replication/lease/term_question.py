"""A primary asks a standby whose stream ended which term it follows.

A standby that hangs up may have heard of a newer primary before this one
did (a switchover, a Lease taken while this primary's clock ran slow). Its
``GET /replication`` says which term it follows: a newer one than ours means
we were deposed, and the role loop steps down at once (``RoleLoop.deposed``)
rather than at its renew deadline. Asked in the background: the shipper that
saw the stream end does not wait.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping

import httpx

from stream_server.replication.lease.roles import RoleLoop

log = logging.getLogger("stream_server.replication")

PEER_QUESTION_TIMEOUT = 2.0  # seconds to ask a standby whose stream ended which term it follows


class TermQuestion:
    def __init__(
        self, roles: RoleLoop, peer_urls: Mapping[str, str], tls: Callable[[], ssl.SSLContext]
    ) -> None:
        """``peer_urls``: each follower's origin by name, as its stream requests gave it."""
        self.roles = roles
        self.peer_urls = peer_urls
        self.tls = tls
        self._asking: set[asyncio.Task[None]] = set()  # ``_check_term_of`` under way

    def ask(self, name: str) -> None:
        url = self.peer_urls.get(name)
        if url is not None:
            task = asyncio.create_task(self._check_term_of(url), name=f"term of {name}")
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _check_term_of(self, url: str) -> None:
        """Ask a standby whose stream ended which term it follows (``GET /replication``);
        a newer one than ours means we were deposed (``RoleLoop.deposed``)."""
        try:
            async with httpx.AsyncClient(timeout=PEER_QUESTION_TIMEOUT, verify=self.tls()) as http:
                answer = (await http.get(f"{url}/replication")).json()
            term, primary = int(answer["term"]), answer.get("primary")
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.info("could not ask %s which term it follows: %s", url, exc)
            return
        await self.roles.deposed(term, primary if isinstance(primary, str) else None)
