"""The Lease holder marks the set's pods itself: the role label the client Services select
on, and the in-sync readiness gate's condition (Patroni's leader labels its own pod).

Without it a failover reached clients only once the operator's next status round moved
the label (one polling thread for every DurableStream); now the replica that takes the
Lease moves it, and the operator's labelling stays as a backstop.

- A primary (it took the Lease, or was handed it) first labels every other pod of the
  set ``standby`` and only then its own ``primary``: the client Service never selects
  two pods. It holds the Lease, so the authority is its own; the old holder stopped
  acknowledging at its renew deadline, before the Lease could be taken. Every write
  is made only while this replica may still acknowledge (``RoleLoop.may_acknowledge``):
  a deposed primary stops marking at once.
- The primary sets the pod condition ``streams.pyds.dev/in-sync`` (the readiness gate
  every pod of a set carries) ``True`` on itself and on each in-sync standby and
  ``False`` on the others, whenever the in-sync set changes and when it takes the
  Lease: a standby that falls behind leaves the ``-replicas`` Service and stops
  counting for the disruption budget, through Kubernetes' own readiness.
- A standby (it stepped down, followed, or just started) labels itself ``standby``.

Best effort, beside the role loop and never in its way: its own task, its own HTTP
client, woken by the role state's ``changed``; a failed write is logged and the whole
pass retried a retry period later, and every ``lease_duration`` a pass looks again
(a label someone else changed comes back). Each pass reads each pod first and writes
only what differs. The pods are the set's by their names: the Lease names replicas by
their pod names (``replication_pod`` must equal ``replica_name``), and a StatefulSet's
are ``<set>-0`` .. ``<set>-(N-1)``, which the pods' Role names one by one
(docs/kubernetes.md, "The pods' rights").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from stream_server.replication.lease.kube_lease import PREFIX, LeaseRecord, api_client, micro_time
from stream_server.replication.lease.roles import RoleLoop

log = logging.getLogger("stream_server.replication")

ROLE = PREFIX + "role"
PRIMARY = "primary"
STANDBY = "standby"
IN_SYNC_GATE = PREFIX + "in-sync"  # the readiness gate's condition type
STRATEGIC_MERGE = "application/strategic-merge-patch+json"  # conditions merge by type
MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class PodMarks:
    """What one pod should carry: its role label, and (None: leave it) its in-sync
    condition."""

    pod: str
    role: str  # PRIMARY or STANDBY
    in_sync: bool | None = None


def set_members(me: str, set_size: int, record: LeaseRecord | None) -> list[str]:
    """The pods of this replica's set, by name: the StatefulSet's ordinals up to the set
    size when ``me`` is one (``ds-1``: ``ds-0`` .. ``ds-(N-1)``), and every replica the
    Lease names (a set scaled up while our settings were older says more), ``me``
    included; sorted."""
    names = {me}
    match = re.fullmatch(r"(.+)-(\d+)", me)
    if match:
        names |= {f"{match.group(1)}-{i}" for i in range(set_size)}
    if record is not None:
        names |= {record.holder, *record.in_sync, *record.eligible, *record.positions}
    return sorted(names - {""})


def wanted_marks(
    me: str, role: str, in_sync: Iterable[str], members: Iterable[str]
) -> list[PodMarks]:
    """The marks to write, in the order to write them: for a primary every other member
    ``standby`` (in sync or not) and then itself ``primary`` and in sync; for a standby
    only its own label (the in-sync conditions are the holder's to set)."""
    if role != PRIMARY:
        return [PodMarks(me, STANDBY)]
    synced = set(in_sync)
    others = [PodMarks(p, STANDBY, p in synced) for p in sorted(set(members) - {me})]
    return [*others, PodMarks(me, PRIMARY, True)]


def pod_role(pod: dict[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE)


def pod_in_sync(pod: dict[str, Any]) -> bool | None:
    """The pod's in-sync condition (None: it has none)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == IN_SYNC_GATE:
            return bool(cond.get("status") == "True")
    return None


def in_sync_condition(value: bool, term: int) -> dict[str, str]:
    """The condition as the primary writes it (a transition: written only on a change)."""
    return {
        "type": IN_SYNC_GATE,
        "status": "True" if value else "False",
        "reason": "InSync" if value else "NotInSync",
        "message": f"{'in' if value else 'not in'} the in-sync set of term {term}",
        "lastTransitionTime": micro_time()[:19] + "Z",
    }


class PodWriteFailed(Exception):
    """The API server could not be asked, or refused for another reason than 404."""


class PodClient:
    """The set's pods over the Kubernetes REST API: read one, patch its labels or its
    status (a strategic merge patch: the conditions merge by type, so the kubelet's and
    everyone else's stay)."""

    def __init__(self, namespace: str, api: str = "") -> None:
        base, self.http = api_client(api)
        self.collection = f"{base}/api/v1/namespaces/{namespace}/pods"

    async def close(self) -> None:
        await self.http.aclose()

    async def get(self, pod: str) -> dict[str, Any] | None:
        r = await self._call("GET", pod)
        return None if r.status_code == 404 else r.json()

    async def label(self, pod: str, role: str) -> None:
        await self._call("PATCH", pod, {"metadata": {"labels": {ROLE: role}}}, MERGE)

    async def set_condition(self, pod: str, condition: dict[str, str]) -> None:
        body = {"status": {"conditions": [condition]}}
        await self._call("PATCH", f"{pod}/status", body, STRATEGIC_MERGE)

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, kind: str = ""
    ) -> httpx.Response:
        headers = {"Content-Type": kind} if kind else {}
        try:
            r = await self.http.request(
                method, f"{self.collection}/{path}", json=body, headers=headers
            )
        except httpx.HTTPError as exc:
            raise PodWriteFailed(f"{method} pod {path}: {exc!r}") from exc
        if r.status_code >= 300 and r.status_code != 404:
            raise PodWriteFailed(f"{method} pod {path}: {r.status_code} {r.text[:200]}")
        return r


class PodMarker:
    """Keeps the pods' marks as ``wanted_marks`` says for the role loop's state."""

    def __init__(
        self, client: PodClient, roles: RoleLoop, pod: str, set_size: int, *, every: float
    ) -> None:
        self.client = client
        self.roles = roles
        self.pod = pod
        self.set_size = set_size
        self.every = every  # seconds between passes that only look again
        self.retry = roles.config.retry_period
        self.failures = 0  # passes in a row with a failed write (a warning on the first)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pod marker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.client.close()

    async def _run(self) -> None:
        while True:
            changed = self.roles.state.changed
            try:
                done = await self.mark()
            except Exception:  # the marker must outlive any one bad answer
                log.exception("marking the pods failed")
                done = False
            wait = self.every if done else self.retry
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)

    async def mark(self) -> bool:
        """One pass: read each pod this replica marks, write what differs. False when a
        write failed or this replica stopped being primary on the way (retried soon)."""
        state = self.roles.state
        role, term = (PRIMARY if self.roles.may_acknowledge else STANDBY), state.term
        members = set_members(self.pod, self.set_size, self.roles.record)
        for marks in wanted_marks(self.pod, role, state.in_sync, members):
            try:
                if not await self._mark(marks, role, term):
                    return False  # deposed on the way: the next pass marks as a standby
            except PodWriteFailed as exc:
                self.failures += 1
                (log.warning if self.failures == 1 else log.debug)(
                    "could not mark pod %s (retried): %s", marks.pod, exc
                )
                return False
        if self.failures:
            log.info("pods marked again after %d failed passes", self.failures)
            self.failures = 0
        return True

    def _entitled(self, role: str, term: int) -> bool:
        """Whether a pass planned as ``role`` in ``term`` may still write: a standby's own
        label always; a primary's marks only while it may acknowledge in that term."""
        return role != PRIMARY or (self.roles.may_acknowledge and self.roles.state.term == term)

    async def _mark(self, marks: PodMarks, role: str, term: int) -> bool:
        """Read the pod, write what differs; False when this replica lost the right to
        (checked before each write: the old holder's late patch never lands on the pod
        a new holder has just labelled)."""
        if not self._entitled(role, term):
            return False
        pod = await self.client.get(marks.pod)
        if pod is None:
            return True  # no such pod (a set smaller than its names, or one not made yet)
        if pod_role(pod) != marks.role:
            if not self._entitled(role, term):
                return False
            await self.client.label(marks.pod, marks.role)
            log.info("labelled pod %s %s (term %d)", marks.pod, marks.role, term)
        if marks.in_sync is not None and pod_in_sync(pod) != marks.in_sync:
            if not self._entitled(role, term):
                return False
            await self.client.set_condition(marks.pod, in_sync_condition(marks.in_sync, term))
            log.info("pod %s in sync: %s (term %d)", marks.pod, marks.in_sync, term)
        return True
