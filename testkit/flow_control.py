"""API Priority and Fairness, as a client of an overloaded kube-apiserver sees it.

When a priority level's seats and queues are full, kube-apiserver refuses the request
with 429 Too Many Requests, ``Retry-After: 1`` and a Status whose reason is
``TooManyRequests`` ("API Priority and Fairness",
https://kubernetes.io/docs/concepts/cluster-administration/flow-control/); client-go
waits as asked and sends the request again. Load is not modelled here: a test says how
many of the next requests are refused (``throttle``), which is what a client can observe,
of one flow if it likes: APF queues each user's requests apart, and here the User-Agent
stands in for the user (the test's own client, kopf's, the operator's are told apart so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import aiohttp.web

RETRY_AFTER_SECONDS = 1


@dataclasses.dataclass
class _Flow:
    agent: str
    methods: frozenset[str]
    left: int

    def matches(self, agent: str, method: str) -> bool:
        return (
            self.left > 0
            and agent.startswith(self.agent)
            and (not self.methods or method.upper() in self.methods)
        )


TOO_MANY_REQUESTS = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Too many requests, please try again later.",
    "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": RETRY_AFTER_SECONDS},
    "code": 429,
}


class FlowControl:
    """How many of the next requests to refuse, by flow, and which were."""

    def __init__(self) -> None:
        self._flows: list[_Flow] = []
        self.throttled: list[str] = []  # the User-Agent of each request refused

    def throttle(self, n: int, agent: str = "", methods: Collection[str] = ()) -> None:
        """Refuse the next ``n`` requests (watches included) whose User-Agent starts with
        ``agent`` ("": of any client) and, if ``methods`` names HTTP methods, that use one
        of them (a FlowSchema's rules match verbs too), with 429."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"throttle: a number of requests, not {n!r}")
        self._flows.append(_Flow(agent, frozenset(m.upper() for m in methods), n))

    def admit(self, agent: str, method: str) -> aiohttp.web.Response | None:
        """None to serve a request, or kube-apiserver's 429 answer to it."""
        flow = next((f for f in self._flows if f.matches(agent, method)), None)
        if flow is None:
            return None
        flow.left -= 1
        self.throttled.append(agent)
        return aiohttp.web.json_response(
            TOO_MANY_REQUESTS,
            status=429,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
