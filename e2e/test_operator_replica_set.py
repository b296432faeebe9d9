"""Issue 16 end to end: a 3-replica DurableStream under the real operator, writers going
through the primary Service while the primary pod is killed, while the image is rolled and while a
switchover asked for with an annotation is made.

kopf runs the real handlers against the emulated API server; the kubelet
stand-in (testkit.kubelet) runs the StatefulSet's pods as real server
processes that elect their primary through the Lease the operator names; the
operator moves the role label the client Service selects on. Writers are
idempotent producers that send every append to wherever the Service routes
now (testkit.services: its ready, selected pods), and retry on a refused
connection, no endpoint, or 503: a retry resends the same Producer-Seq, so
it can never land twice.

The kill must be named in a ``failover`` Event for the new term (the status
shows ``FailingOver`` too, unless the killed primary was back within one
status interval). The roll must replace the standbys first and the old
primary last, after a switchover: no pod is stopped while the Lease names it
(the stand-in notes the holder as it stops each pod).

Every attempt goes into a testkit.history.History. At the end every
replica must hold byte-identical streams and the checker must find every
acknowledged append exactly once, in its writer's order. The longest wait a
writer saw between two acknowledgements around each event is printed (the
pause), never asserted: the waits below are liveness bounds only.

The emulated API server runs as a process of its own (testkit.kube_serve),
and the operator reaches the pods for a switchover where the stand-in runs
them (``replica_set.use_pod_urls``, standing in for cluster DNS).

The scenario runs twice: with the pods as processes of this checkout, and
with the pods as real containers of the server image under podman
(``testkit.pod_runtimes.Containers``: the pod's user, read-only root, no
capabilities, its volume and Secrets mounted where the template says). For
the roll, the built image is tagged once more as the new version: the
template names another image and each pod is replaced by a container of it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator import KIND
from stream_operator.controllers import replica_set
from stream_operator.decisions.rollout import SWITCHOVER_TO
from stream_operator.specs.render import lease_name
from testkit import images
from testkit.cluster import Cluster
from testkit.history import History, check
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet, Pod
from testkit.ledger import NAME, NS, SPEC, STREAMS, WRITERS, ds_status, settled
from testkit.operator import operated_api_server
from testkit.pod_runtimes import Runtime
from testkit.service_writers import Writers, converged, create_streams, until
from testkit.services import ServiceEndpoints

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
ROLLED_IMAGE = "durable-streams-server:0.1.1"


# -- what the operator reports ----------------------------------------------------------------


def failover_events(kube: Cluster, term: int) -> list[str]:
    return [
        e["message"]
        for e in kube.list("Event", NS)
        if e["involvedObject"]["name"] == NAME
        and e["reason"] == "PrimaryChanged"
        and e["message"].startswith("failover:")
        and e["message"].endswith(f"(term {term})")
    ]


def true_conditions(st: dict[str, Any]) -> set[str]:
    return {c["type"] for c in st.get("conditions") or [] if c.get("status") == "True"}


@dataclass
class StatusLog:
    """The DurableStream's status sampled every 0.5 s: (time, phase, primary, true
    conditions)."""

    kube: Cluster
    samples: list[tuple[float, str, str, set[str]]] = field(default_factory=list)
    notes: list[tuple[float, str]] = field(default_factory=list)  # the Progressing message
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                st = ds_status(self.kube)
            except httpx.HTTPError:
                continue
            entry = (st.get("phase") or "", st.get("primary") or "", true_conditions(st))
            self.samples.append((time.monotonic(), *entry))
            rolling = [c for c in st.get("conditions") or [] if c["type"] == "Progressing"]
            self.notes.append((time.monotonic(), f"{rolling[0]['message'] if rolling else ''}"))

    def between(self, start: float, end: float) -> list[tuple[float, str, str, set[str]]]:
        return [s for s in self.samples if start <= s[0] <= end]


def dump_timeline(path: Path, kubelet: Kubelet, log: StatusLog) -> None:
    """The stand-in's starts and stops and the sampled status, in time order, for reading
    after a failure."""
    rows = [(t, f"kubelet {what} {NAME}-{o} {rev}") for t, what, o, rev in kubelet.history]
    rows += [(t, f"status {phase} primary={p} {sorted(c)}") for t, phase, p, c in log.samples]
    rows += [(t, f"progressing: {note}") for t, note in log.notes]
    lines = [f"{t:.2f} {what}" for t, what in sorted(rows)]
    path.write_text("\n".join([*lines, *kubelet.api_errors]) + "\n")


# -- the test -------------------------------------------------------------------------------------


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Cluster]:
    with operated_api_server(tmp_path) as c:
        yield c


@pytest.fixture(params=images.POD_RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """How the pods run: processes of this checkout, or containers of the server image (the
    rolled version a second tag of the same build)."""
    with images.pod_runtime(request.param, SPEC["image"], also=[ROLLED_IMAGE]) as runtime:
        yield runtime


def ordinal(pod_name: str) -> int:
    return int(pod_name.rsplit("-", 1)[1])


def test_writers_through_the_primary_service_lose_nothing_on_kill_and_roll(
    kube: Cluster, runtime: Runtime, tmp_path: Path
) -> None:
    stopped_as: list[tuple[int, str, str]] = []  # (ordinal, revision, Lease holder then)

    def note_holder(pod: Pod) -> None:
        lease = kube.get("Lease", NS, lease_name(NAME)) or {}
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        stopped_as.append((pod.ordinal, pod.revision, holder))

    history = History()
    log = StatusLog(kube)
    sampler = threading.Thread(target=log.run, daemon=True)
    with Kubelet(
        kube, NS, NAME, tmp_path, restart_delay=3.0, before_stop=note_holder, runtime=runtime
    ) as kubelet:
        sampler.start()
        # The operator reaches a pod (to ask for a switchover) where the stand-in runs it,
        # as cluster DNS would resolve the pod's name through the headless Service.
        replica_set.use_pod_urls(kubelet.pod_url)
        service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of)
        writers = Writers(service, history, WRITERS)
        try:
            kube.create(durable_stream(NAME, SPEC)).raise_for_status()
            first = until(lambda: settled(kube, 1), lambda: f"a primary: {ds_status(kube)}")
            # Each replica's lag, from the positions the primary writes into the Lease.
            until(
                lambda: all(
                    isinstance(r.get("lagBatches"), int) for r in ds_status(kube)["replicaStatus"]
                ),
                lambda: f"every replica's lag in the status: {ds_status(kube)}",
            )
            create_streams(service, STREAMS)
            writers.start()
            until(lambda: writers.acked_after(0), "first appends acknowledged")

            # (a) kill -9 in the primary's pod: the kubelet restarts the container; the
            # Lease goes, under a new term, to an in-sync standby or back to the restarted
            # old primary (the holder may retake it at once when no one reported more:
            # docs/replication.md), and the operator moves the Service to it.
            old = first["primary"]
            killed = time.monotonic()
            kubelet.kill(ordinal(old), signal.SIGKILL)
            after_kill = until(
                lambda: settled(kube, 1, after_term=first["term"]),
                lambda: f"Ready with a primary of a new term after the kill: {ds_status(kube)}",
            )
            kill_pause = writers.resumed(killed, "the failover")
            seen = log.between(killed, time.monotonic())
            assert any(primary == after_kill["primary"] for _, _, primary, _ in seen)
            # The status shows FailingOver unless the killed primary was back within one
            # status interval; the Event names the failover either way.
            until(
                lambda: failover_events(kube, after_kill["term"]),
                lambda: (
                    f"a failover Event for term {after_kill['term']}: {seen}; the Events: "
                    f"{[(e['reason'], e['message']) for e in kube.list('Event', NS)]}"
                ),
            )

            # (b) a new image: every pod restarts on it, the writers go on.
            rolled_from = after_kill["primary"]
            revisions = {p.revision for p in kubelet.ready_pods()}
            rolled = time.monotonic()
            kube.patch(KIND, NS, NAME, {"spec": {"image": ROLLED_IMAGE}}).raise_for_status()

            def rolled_out() -> dict[str, Any] | None:
                pods = kubelet.ready_pods()
                fresh = len(pods) == 3 and not {p.revision for p in pods} & revisions
                return settled(kube, 2, after_term=after_kill["term"]) if fresh else None

            after_roll = until(rolled_out, lambda: f"rolled out: {ds_status(kube)}")
            roll_pause = writers.resumed(rolled, "the roll")

            # (c) a switchover asked for by hand: the operator asks the real primary to
            # hand over to the named standby, then forgets the request.
            target = next(
                r["name"]
                for r in after_roll["replicaStatus"]
                if r["role"] == "standby" and r["inSync"]
            )
            asked = time.monotonic()
            body = {"metadata": {"annotations": {SWITCHOVER_TO: target}}}
            kube.patch(KIND, NS, NAME, body).raise_for_status()
            after_ask = until(
                lambda: (
                    (st := settled(kube, 2, after_term=after_roll["term"]))
                    and st["primary"] == target
                    and st
                ),
                lambda: f"{target} primary on request: {ds_status(kube)}",
            )
            ask_pause = writers.resumed(asked, "the requested switchover")
            notes = (kube.get(KIND, NS, NAME) or {})["metadata"].get("annotations") or {}
            assert SWITCHOVER_TO not in notes
        finally:
            writers.stop.set()
            log.stop.set()
            history.dump(tmp_path / "history.jsonl")
            dump_timeline(tmp_path / "timeline.txt", kubelet, log)
        writers.finish()
        final = converged(kubelet, STREAMS, 3)

    history.dump(tmp_path / "history.jsonl")
    report = check(history, final)
    print(f"\nhistory: {report.summary()}")
    assert report.ok, f"{report.summary()} (history in {tmp_path / 'history.jsonl'})"
    assert report.acknowledged > 0

    roll_stops = [(o, holder) for o, rev, holder in stopped_as if rev in revisions]
    assert sorted(o for o, _ in roll_stops) == [0, 1, 2], stopped_as  # each pod once
    # Standbys first, then a switchover, the old primary last: no pod was stopped while
    # the Lease named it.
    assert roll_stops[-1][0] == ordinal(rolled_from), stopped_as
    assert all(holder != f"{NAME}-{o}" for o, holder in roll_stops), stopped_as
    print(
        f"longest pause a writer saw: {kill_pause:.2f} s around the kill of {old} "
        f"(primary after: {after_kill['primary']}, term {after_kill['term']}), "
        f"{roll_pause:.2f} s around the roll (primary {rolled_from} -> {after_roll['primary']}), "
        f"{ask_pause:.2f} s around the switchover asked for ({after_roll['primary']} -> "
        f"{after_ask['primary']}); "
        f"lease {SPEC['replication']['leaseDurationSeconds']} s"
    )
