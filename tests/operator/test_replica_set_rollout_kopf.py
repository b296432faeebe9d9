"""Issue 16: the real kopf operator rolls a replica set without losing a write, and points
its Spark jobs at an in-sync standby.

The test plays the StatefulSet controller under ``updateStrategy: OnDelete``
(a deleted pod comes back on the update revision, ready, and rejoins the
Lease's in-sync set a moment later, as a standby that catches up) and checks,
at every deletion the operator makes, that the deleted pod was not the primary
and that every other pod was ready and in sync. The primary is played by
``primary_stand_in``: a real HTTP server on a real port that checks the peer
token from the operator's Secret and moves the Lease in the emulated API server
as the real primary's compare-and-swap would.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from primary_stand_in import StandIn, primary_stand_in

from stream_operator import KIND
from stream_operator.decisions.rollout import SWITCHOVER_TO
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import IN_SYNC, write_replica_lease
from testkit.operator import running_operator
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

pytestmark = pytest.mark.slow

NS = "default"
REVISION = "controller-revision-hash"


def revision(sts: dict[str, Any]) -> str:
    template = json.dumps(sts["spec"]["template"], sort_keys=True).encode()
    return "events-" + hashlib.sha256(template).hexdigest()[:10]


def lease(c: Cluster) -> dict[str, Any]:
    return c.get("Lease", NS, "events-leader") or {"metadata": {}, "spec": {}}


def write_lease(c: Cluster, holder: str, term: int, in_sync: list[str]) -> None:
    write_replica_lease(c, "events", NS, holder, term, in_sync)


def set_in_sync(c: Cluster, in_sync: list[str]) -> None:
    body = {"metadata": {"annotations": {IN_SYNC: json.dumps(sorted(in_sync))}}}
    c.patch("Lease", NS, "events-leader", body).raise_for_status()


def in_sync_of(c: Cluster) -> list[str]:
    return json.loads((lease(c)["metadata"].get("annotations") or {}).get(IN_SYNC) or "[]")


class OnDeleteController:
    """The StatefulSet controller (OnDelete) and the kubelet, as far as the rollout needs:
    pods recreated on the update revision, ready at once, back in sync one round later.
    Records each deletion and what was true when it happened."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.deleted: list[str] = []
        self.violations: list[str] = []
        self.reasons: list[str] = []  # the Progressing reasons seen, in order
        self._resync: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sts")

    def start(self, *, watch: bool = True) -> None:
        """The pods, ready; with ``watch``, deleted ones recreated until ``stop``."""
        sts = wait_for(lambda: self.c.get("StatefulSet", NS, "events"), message="the sts")
        claim_volumes(self.c, sts)
        for i in range(sts["spec"]["replicas"]):
            self._create(sts, i)
        self._report(sts)
        if watch:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _create(self, sts: dict[str, Any], i: int) -> None:
        obj = pod_object(sts, i)
        obj["metadata"]["labels"] = {**obj["metadata"]["labels"], REVISION: revision(sts)}
        self.c.create(obj).raise_for_status()
        container = sts["spec"]["template"]["spec"]["containers"][0]
        status = pod_status(container, ready=True, restarts=0)
        self.c.patch("Pod", NS, f"events-{i}", {"status": status}, status=True).raise_for_status()

    def _report(self, sts: dict[str, Any]) -> None:
        rev = revision(sts)
        pods = self.c.list("Pod", NS)
        updated = sum(1 for p in pods if p["metadata"]["labels"].get(REVISION) == rev)
        want = sts["spec"]["replicas"]
        current = rev if updated == want else "events-old"
        status = statefulset_status(sts, len(pods), len(pods), updated, current, rev)
        if status != {k: (sts.get("status") or {}).get(k) for k in status}:
            self.c.patch("StatefulSet", NS, "events", {"status": status}, status=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self._round()
            except Exception as exc:  # the API server goes first at teardown
                if not self._stop.is_set():
                    self.violations.append(f"controller failed: {exc!r}")

    def _round(self) -> None:
        ds = self.c.get(KIND, NS, "events") or {}
        reason = next(
            (
                c["reason"]
                for c in (ds.get("status") or {}).get("conditions") or []
                if c["type"] == "Progressing"
            ),
            None,
        )
        if reason and (not self.reasons or self.reasons[-1] != reason):
            self.reasons.append(reason)
        sts = self.c.get("StatefulSet", NS, "events")
        present = {p["metadata"]["name"] for p in self.c.list("Pod", NS)}
        # Last round's recreated pods have caught up: back in the in-sync set.
        if self._resync:
            set_in_sync(self.c, sorted(set(in_sync_of(self.c)) | set(self._resync)))
            self._resync = []
        for i in range(sts["spec"]["replicas"]):
            pod = f"events-{i}"
            if pod in present:
                continue
            held = lease(self.c)
            holder = held["spec"].get("holderIdentity")
            synced = {holder, *in_sync_of(self.c)}
            if pod == holder:
                self.violations.append(f"{pod} was deleted while it held the Lease")
            lagging = sorted(present - synced)
            if lagging:
                self.violations.append(f"{pod} was deleted while {lagging} were not in sync")
            self.deleted.append(pod)
            set_in_sync(self.c, [n for n in in_sync_of(self.c) if n != pod])
            self._create(sts, i)
            self._resync.append(pod)
        self._report(sts)


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cluster, StandIn]]:
    from stream_operator.controllers import replica_set

    # Every round a status refresh (where the rollout steps), not a whole reconcile: the
    # rollout takes one step a round, and a reconcile's many requests slow the rounds.
    monkeypatch.setenv("DS_OPERATOR_RESYNC_INTERVAL", "30")  # read as the operator starts
    with cluster() as c, primary_stand_in(c.url, NS, "events") as stand_in:
        replica_set.use_pod_urls(stand_in.url)
        try:
            with running_operator(c):
                yield c, stand_in
        finally:
            replica_set.use_pod_urls(None)


def events(c: Cluster, reason: str) -> list[str]:
    return [
        e["message"]
        for e in c.list("Event", NS)
        if e["involvedObject"]["name"] == "events" and e["reason"] == reason
    ]


def status_of(c: Cluster) -> dict[str, Any]:
    return (c.get(KIND, NS, "events") or {}).get("status") or {}


def condition(c: Cluster, ctype: str) -> dict[str, Any]:
    return next((x for x in status_of(c).get("conditions") or [] if x["type"] == ctype), {})


def test_an_image_change_updates_the_standbys_then_switches_over_then_the_old_primary(
    kube: tuple[Cluster, StandIn],
):
    c, stand_in = kube
    c.create(durable_stream("events", {"replicas": 3, "image": "ds:1"})).raise_for_status()
    controller = OnDeleteController(c)
    controller.start()
    try:
        # The primary in the middle (after some failover): a partition could not hold it.
        write_lease(c, "events-1", 3, ["events-0", "events-2"])
        wait_for(lambda: status_of(c).get("phase") == "Ready", message="Ready")
        sts = c.get("StatefulSet", NS, "events")
        assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
        # The first switchover is refused (the target did not catch up in time).
        stand_in.fail_next(503, "CATCHUP_TIMEOUT")
        c.patch(KIND, NS, "events", {"spec": {"image": "ds:2"}}).raise_for_status()
        wait_for(lambda: len(controller.deleted) == 3, timeout=60, message="three pods updated")
        wait_for(lambda: condition(c, "Progressing").get("status") == "False", message="done")
    finally:
        controller.stop()
    assert controller.violations == []
    assert controller.deleted == ["events-2", "events-0", "events-1"]
    assert [(pod, status) for pod, _, status in stand_in.calls] == [
        ("events-1", 503),
        ("events-1", 200),
    ]
    target = stand_in.calls[-1][1]
    assert target == "events-0"  # updated, in sync, the lowest ordinal of equals
    assert status_of(c)["primary"] == "events-0" and status_of(c)["term"] == 4
    # The Progressing reasons in the order they were seen (a short one may be missed
    # between two looks; these four each last at least one round of the operator).
    steps = [r for r in controller.reasons if r not in ("RollingUpdate", "Stable")]
    assert steps[0] == "UpdatingStandbys" and steps[-1] == "UpdatingFormerPrimary", steps
    assert steps.index("SwitchoverFailed") < len(steps) - 2, steps
    wait_for(lambda: events(c, "Switchover"), message="the switchover's Event")
    assert events(c, "Switchover")[0].startswith("switchover events-1 -> events-0 (term 4")
    failed = events(c, "SwitchoverFailed")
    assert failed and "503 CATCHUP_TIMEOUT" in failed[0]
    changed = wait_for(lambda: events(c, "PrimaryChanged"), message="PrimaryChanged")
    assert changed == ["switchover: primary events-1 -> events-0 (term 4)"]
    assert condition(c, "FailingOver")["status"] == "False"
    images = {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in c.list("Pod", NS)}
    assert images == {"events-0": "ds:2", "events-1": "ds:2", "events-2": "ds:2"}


ANALYTICS = {
    "enabled": True,
    "schedule": "@daily",
    "output": {"claimName": "analytics-out"},
    "jobs": [{"name": "stats", "type": "stream-stats"}],
}


def test_spark_jobs_read_an_in_sync_standby_and_wait_while_there_is_none(
    kube: tuple[Cluster, StandIn],
):
    c, _ = kube
    c.install_spark_operator_crd()
    c.create(durable_stream("events", {"replicas": 3, "analytics": ANALYTICS}))
    controller = OnDeleteController(c)
    controller.start(watch=False)  # no pod is deleted here

    def jobs() -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in c.list("ScheduledSparkApplication", NS)}

    def reads(job: dict[str, Any]) -> tuple[str, str, bool]:
        template = job["spec"]["template"]
        claim = template["volumes"][0]["persistentVolumeClaim"]["claimName"]
        term = template["driver"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ][0]
        pod = term["labelSelector"]["matchLabels"]["statefulset.kubernetes.io/pod-name"]
        return claim, pod, job["spec"]["suspend"]

    try:
        write_lease(c, "events-0", 1, [])
        wait_for(
            lambda: "(events-0 holds the Lease)" in condition(c, "Analytics").get("message", ""),
            message="the jobs waiting for a standby in sync",
        )
        cond = condition(c, "Analytics")
        assert (cond["status"], cond["reason"]) == ("False", "NoStandbyInSync")
        assert cond["message"].startswith("no standby is in sync (events-0 holds the Lease)")
        assert jobs() == {}
        set_in_sync(c, ["events-1", "events-2"])
        wait_for(lambda: "events-1-stats" in jobs(), message="a job on events-1")
        assert list(jobs()) == ["events-1-stats"]  # one copy is read, not three
        assert reads(jobs()["events-1-stats"]) == ("data-events-1", "events-1", False)
        wait_for(lambda: condition(c, "Analytics").get("status") == "True", message="Scheduled")
        assert "reading the volume of events-1" in condition(c, "Analytics")["message"]
        # events-1 falls behind: the job moves to the other in-sync standby.
        set_in_sync(c, ["events-2"])
        wait_for(lambda: list(jobs()) == ["events-2-stats"], message="moved to events-2")
        assert reads(jobs()["events-2-stats"]) == ("data-events-2", "events-2", False)
        # None in sync: held (suspended) where it is, and the condition says why.
        set_in_sync(c, [])
        wait_for(lambda: jobs()["events-2-stats"]["spec"]["suspend"], message="suspended")
        wait_for(
            lambda: condition(c, "Analytics").get("reason") == "NoStandbyInSync",
            message="the condition saying why",
        )
        # events-2 becomes the primary: never its volume; events-0 is in sync.
        write_lease(c, "events-2", 2, ["events-0"])
        wait_for(lambda: list(jobs()) == ["events-0-stats"], message="moved off the primary")
        assert reads(jobs()["events-0-stats"]) == ("data-events-0", "events-0", False)
    finally:
        controller.stop()


def test_a_switchover_asked_for_with_the_annotation_is_tried_once_then_forgotten(
    kube: tuple[Cluster, StandIn],
):
    """``streams.pyds.dev/switchover-to: <pod>``: refused without a call when the pod is not
    a replica of the set; made when it is in sync; one attempt when the primary refuses;
    each time the annotation goes and an Event says what came of it."""
    c, stand_in = kube
    c.create(durable_stream("events", {"replicas": 3})).raise_for_status()
    controller = OnDeleteController(c)
    controller.start(watch=False)
    write_lease(c, "events-1", 3, ["events-0", "events-2"])
    wait_for(lambda: status_of(c).get("primary") == "events-1", message="events-1 primary")

    def ask(pod: str) -> None:
        body = {"metadata": {"annotations": {SWITCHOVER_TO: pod}}}
        c.patch(KIND, NS, "events", body).raise_for_status()

    def forgotten() -> bool:
        notes = (c.get(KIND, NS, "events") or {})["metadata"].get("annotations") or {}
        return SWITCHOVER_TO not in notes

    ask("events-7")
    refused = wait_for(lambda: events(c, "SwitchoverRequest"), message="the refusal's Event")
    assert refused == [f"{SWITCHOVER_TO}=events-7: 'events-7' is not a replica of events "
                       "(events-0, events-1, events-2)"]  # fmt: skip
    wait_for(forgotten, message="the annotation removed")
    assert stand_in.calls == []

    ask("events-2")
    wait_for(lambda: status_of(c).get("primary") == "events-2", message="events-2 primary")
    wait_for(forgotten, message="the annotation removed")
    assert [(pod, target, code) for pod, target, code in stand_in.calls] == [
        ("events-1", "events-2", 200)
    ]
    made = wait_for(lambda: events(c, "Switchover"), message="the switchover's Event")
    assert made[0].startswith("switchover events-1 -> events-2 (term 4")
    assert made[0].endswith(f"asked for with {SWITCHOVER_TO}")

    stand_in.fail_next(503, "CATCHUP_TIMEOUT")
    ask("events-0")
    failed = wait_for(lambda: events(c, "SwitchoverFailed"), message="the failure's Event")
    assert "503 CATCHUP_TIMEOUT" in failed[0] and failed[0].endswith("again to retry")
    wait_for(forgotten, message="the annotation removed")
    assert len(stand_in.calls) == 2  # one attempt, not one a round
    assert status_of(c)["primary"] == "events-2"


def test_supervised_updates_the_standbys_then_waits_for_the_users_switchover(
    kube: tuple[Cluster, StandIn],
):
    """Issue 25: ``primaryUpdateStrategy: supervised``: the standbys are updated, then
    nothing until the user switches over (the status says how); then the former primary."""
    c, stand_in = kube
    spec = {"replicas": 3, "image": "ds:1", "primaryUpdateStrategy": "supervised"}
    c.create(durable_stream("events", spec)).raise_for_status()
    controller = OnDeleteController(c)
    controller.start()
    try:
        write_lease(c, "events-1", 3, ["events-0", "events-2"])
        wait_for(lambda: status_of(c).get("phase") == "Ready", message="Ready")
        c.patch(KIND, NS, "events", {"spec": {"image": "ds:2"}}).raise_for_status()
        waiting = wait_for(
            lambda: events(c, "WaitingForSwitchover"), timeout=60, message="the wait's Event"
        )
        command = f"kubectl annotate dstream events {SWITCHOVER_TO}=events-0"
        assert waiting[0].endswith(command)
        cond = wait_for(
            lambda: (
                (x := condition(c, "Progressing")).get("reason") == "WaitingForSwitchover" and x
            ),
            message="Progressing: WaitingForSwitchover",
        )
        assert cond["status"] == "True" and cond["message"].endswith(command)
        # Standbys updated, the primary untouched, no switchover of the operator's own.
        assert controller.deleted == ["events-2", "events-0"]
        assert stand_in.calls == []
        body = {"metadata": {"annotations": {SWITCHOVER_TO: "events-2"}}}
        c.patch(KIND, NS, "events", body).raise_for_status()
        wait_for(lambda: len(controller.deleted) == 3, timeout=60, message="the former primary")
        wait_for(lambda: condition(c, "Progressing").get("status") == "False", message="done")
    finally:
        controller.stop()
    assert controller.violations == []
    assert controller.deleted == ["events-2", "events-0", "events-1"]
    assert [(pod, target, code) for pod, target, code in stand_in.calls] == [
        ("events-1", "events-2", 200)
    ]
    assert status_of(c)["primary"] == "events-2"
    steps = [r for r in controller.reasons if r not in ("RollingUpdate", "Stable")]
    assert steps[0] == "UpdatingStandbys" and steps[-1] == "UpdatingFormerPrimary", steps
    assert "WaitingForSwitchover" in steps
    assert len(events(c, "WaitingForSwitchover")) == 1  # told once, not every round
    images = {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in c.list("Pod", NS)}
    assert images == {"events-0": "ds:2", "events-1": "ds:2", "events-2": "ds:2"}
