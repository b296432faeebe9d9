"""The Lease in memory: the API server's compare-and-swap, reached over the network.

``LeaseServer`` keeps the one Lease object with a resourceVersion that grows
with every write, and answers 409 (``LeaseConflict``) to a create when it
exists and to a replace naming another version, as kube-apiserver does.
``SimLeaseClient`` is what the real ``RoleLoop`` gets instead of
``lease.LeaseClient``: each call is a request over the simulated network to
``"api"``, so a call's answer can be lost after the write happened (the
client times out: ``LeaseUnavailable``). There is no watch: the role loop
polls, as it does against an API that refuses watches.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

from stream_server.replication.lease.kube_lease import LeaseConflict, LeaseRecord, LeaseUnavailable
from testkit.simulate.links import Network, Reply

API = "api"
TIMEOUT = 1.0  # seconds a Lease call waits for its answer (the real 5 s, scaled as the Lease)


def _copy(record: LeaseRecord) -> LeaseRecord:
    return dataclasses.replace(
        record,
        in_sync=list(record.in_sync),
        eligible=list(record.eligible),
        positions=dict(record.positions),
        kept={},
        renew_time="",
        acquire_time="",
    )


class LeaseServer:
    def __init__(
        self,
        trace: Callable[[str], None] = lambda _: None,
        written: Callable[[LeaseRecord], None] = lambda _: None,
    ) -> None:
        self.trace = trace
        self.written = written  # told of each write as it lands (``World.lease_written``)
        self.record: LeaseRecord | None = None
        self._version = 0
        # Every write that landed: (version, term, holder, in_sync, eligible), for the trace
        # and the oracle (one holder per term).
        self.writes: list[tuple[int, int, str, list[str], list[str]]] = []

    def apply(self, op: str, record: LeaseRecord | None) -> LeaseRecord | Exception | None:
        if op == "get":
            return None if self.record is None else _copy(self.record)
        assert record is not None
        if op == "create" and self.record is not None:
            return LeaseConflict("the Lease exists")
        if op == "replace" and (self.record is None or record.version != self.record.version):
            return LeaseConflict("the Lease changed since it was read")
        self._version += 1
        self.record = dataclasses.replace(_copy(record), version=str(self._version))
        r = self.record
        self.writes.append((self._version, r.term, r.holder, list(r.in_sync), list(r.eligible)))
        self.trace(
            f"lease {op} v{r.version} term {r.term} holder {r.holder or '-'} in-sync "
            f"{r.in_sync} eligible {r.eligible}"
        )
        self.written(r)
        return _copy(r)


class SimLeaseClient:
    """``lease.LeaseClient``'s calls, over the simulated network (module doc)."""

    def __init__(
        self, server: LeaseServer, net: Network, member: str, reordered_answers: bool = True
    ) -> None:
        self.server = server
        self.net = net
        self.member = member
        # The real client holds a pool of connections, so its answers may overtake each
        # other (the default): seed 33 found a late renewal's answer putting back an
        # older in-sync set (``LeaseWrites._take_sets`` now numbers them). One
        # connection, answers in the order of the requests: ``--in-order-lease-answers``.
        if not reordered_answers:
            net.ordered |= {(member, API), (API, member)}

    async def get(self) -> LeaseRecord | None:
        return await self._call("get", None)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        written = await self._call("create", dataclasses.replace(record, version=""))
        assert written is not None
        return written

    async def replace(self, record: LeaseRecord) -> LeaseRecord:
        assert record.version, "a replace must name the version it read"
        written = await self._call("replace", record)
        assert written is not None
        return written

    async def watch(self) -> AsyncIterator[LeaseRecord]:
        raise LeaseUnavailable("the simulated API has no watch: the role loop polls")
        yield  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        pass

    async def _call(self, op: str, record: LeaseRecord | None) -> LeaseRecord | None:
        sent = None if record is None else _copy(record)

        def arrive(reply: Reply) -> None:
            reply(self.server.apply(op, sent))

        try:
            answer = await asyncio.wait_for(self.net.request(self.member, API, arrive), TIMEOUT)
        except TimeoutError:
            raise LeaseUnavailable(f"{op}: no answer within {TIMEOUT}s") from None
        if isinstance(answer, Exception):
            raise answer
        assert answer is None or isinstance(answer, LeaseRecord)
        return answer
