"""One active operator: leader election on a coordination.k8s.io Lease.

Why a Lease and not kopf peering: peering only pauses an operator when it
sees a peer of higher priority, and two peers of the same priority both
pause, so two replicas of one Deployment (same priority) would serve nobody;
a new pod also acts before it has read the peering object. A Lease, changed
by compare-and-swap on its resourceVersion, names one holder: a candidate
takes it only when the holder has not renewed it for ``lease_duration``,
and a leader that cannot renew it within ``renew_deadline`` (shorter than
the lease) stops acting and exits, so it is gone before anyone else may take
over. The architecture's replica sets use the same Lease mechanics.

The election itself is the official client's (``kubernetes.leaderelection``
with its ``LeaseLock``: client-go's algorithm, timed on the local clock from
the moment a change of the record was seen, so clock skew between nodes does
not matter). Around it, this module adds what that class lacks: a stop (a
process that ends on SIGTERM releases the Lease so the standby takes over at
once instead of waiting it out), a check the handlers make before each write
(``may_act``: a process that was frozen or cut off, and has not renewed in
time, writes nothing while it notices it lost), and errors that do not kill
the candidate (a connection refused is retried like a conflict).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timings:
    """client-go's defaults (seconds): lease 15, renew deadline 10, retry every 2."""

    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2

    def check(self) -> None:
        """The client's own checks end the process (sys.exit): say what is wrong first."""
        if self.retry_period < 1:
            raise ValueError("the retry period must be at least 1 s")
        if self.renew_deadline <= 1.2 * self.retry_period:
            raise ValueError("the renew deadline must exceed 1.2 times the retry period")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("the lease duration must exceed the renew deadline")


class _Election(leaderelection.LeaderElection):
    """The client's election, reporting each successful renewal and stoppable."""

    def __init__(self, config: electionconfig.Config, owner: Leadership) -> None:
        super().__init__(config)  # type: ignore[no-untyped-call]
        self._owner = owner

    def try_acquire_or_renew(self) -> bool:
        # Under the owner's lock, so that no renewal is under way when the Lease is
        # released: one in flight would make the release's compare-and-swap fail, or,
        # reading the released record, take the Lease again.
        with self._owner.renewing:
            if self._owner.stopping.is_set():
                return False  # a stopping leader renews nothing; its release stays released
            # A renewal counts from before it was sent, not from its answer: a process
            # frozen (SIGSTOP, a stalled node) between the write and its answer would
            # otherwise, thawed, count a renewal made long ago as made now, and act for a
            # whole deadline on a Lease another process has taken since.
            sent = time.monotonic()
            try:
                held = bool(super().try_acquire_or_renew())  # type: ignore[no-untyped-call]
            except Exception as exc:  # connection errors: retry, as for a conflict
                logger.warning("lease %s: %s", self._owner.name, exc)
                return False
        if held:
            self._owner.renewed(sent)
        return held


class Leadership:
    """Hold the Lease ``namespace/name`` as ``identity`` while ``work`` runs."""

    def __init__(
        self,
        api_client: client.ApiClient,
        name: str,
        namespace: str,
        identity: str,
        timings: Timings = Timings(),
    ) -> None:
        timings.check()
        self.api_client = api_client
        self.name, self.namespace, self.identity = name, namespace, identity
        self.timings = timings
        self.elected = threading.Event()
        self.lost = threading.Event()  # set when the Lease could not be renewed in time
        # The same, as kopf's stop flag: a Future, which kopf awaits in its own loop (a
        # threading.Event it would wait for in an executor thread, which then keeps the
        # process from exiting after SIGTERM).
        self.stop: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.stopping = threading.Event()
        self.renewing = threading.Lock()  # held by the election thread while it renews
        self._last_renewal: float | None = None
        self._guard = threading.Lock()

    def renewed(self, at: float) -> None:
        """A renewal sent at ``at`` (monotonic) succeeded; renewals only move forward."""
        with self._guard:
            if self._last_renewal is None or at > self._last_renewal:
                self._last_renewal = at

    def held(self) -> bool:
        """Whether this process may act: it renewed the Lease less than a deadline ago."""
        with self._guard:
            last = self._last_renewal
        return (
            self.elected.is_set()
            and not self.lost.is_set()
            and last is not None
            and time.monotonic() - last < self.timings.renew_deadline
        )

    def _on_lost(self) -> None:
        self.lost.set()
        if not self.stop.done():
            self.stop.set_result(None)

    def run(self, work: Callable[[concurrent.futures.Future[None]], None]) -> bool:
        """Wait for the Lease, run ``work(stop)`` while it is held; True if it was lost.

        ``stop`` is set when the Lease is lost; ``work`` must return then. When ``work``
        returns for another reason (SIGTERM), the Lease is released.
        """
        lock = LeaseLock(self.name, self.namespace, self.identity)  # type: ignore[no-untyped-call]
        lock.api_instance = client.CoordinationV1Api(self.api_client)
        t = self.timings
        config = electionconfig.Config(  # type: ignore[no-untyped-call]
            lock,
            lease_duration=t.lease_duration,
            renew_deadline=t.renew_deadline,
            retry_period=t.retry_period,
            onstarted_leading=self.elected.set,
            onstopped_leading=self._on_lost,
        )
        election = _Election(config, self)
        thread = threading.Thread(target=election.run, daemon=True, name="leader-election")
        thread.start()
        logger.info("waiting for the lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not self.elected.wait(1.0):
            if not thread.is_alive():
                raise RuntimeError("the leader election ended before this process was elected")
        logger.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
        try:
            work(self.stop)
        finally:
            # Decided once: the renewal thread, told to stop, will "lose" the Lease too.
            lost = self.lost.is_set()
            with self.renewing:  # waits out a renewal under way; none starts after
                self.stopping.set()
            if not lost:
                self._release()
        if lost:
            logger.error("lost the lease %s/%s: stopping", self.namespace, self.name)
        return lost

    def _release(self) -> None:
        """Give the Lease up (compare-and-swap), as client-go does with ReleaseOnCancel."""
        api = client.CoordinationV1Api(self.api_client)
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            now = datetime.datetime.now(datetime.UTC)
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.acquire_time = now
            lease.spec.renew_time = now
            api.replace_namespaced_lease(self.name, self.namespace, lease)
            logger.info("released the lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # the standby takes over when the lease runs out
            logger.warning("could not release the lease %s/%s: %s", self.namespace, self.name, exc)


def identity() -> str:
    """This replica's name: the pod's (POD_NAME, from the downward API), else the host's."""
    return os.environ.get("POD_NAME") or socket.gethostname()


_current: Leadership | None = None


def install(leadership: Leadership | None) -> None:
    """Make ``may_act`` follow this leadership (None: no election, always act)."""
    global _current
    _current = leadership


def may_act() -> bool:
    """Whether writes are allowed now: no election configured, or the Lease is held."""
    return _current is None or _current.held()
