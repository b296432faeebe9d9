"""Issue 25, the lifecycle annotations end to end, under the real operator with the pods as
real server processes (the kubelet stand-in) and writers through the client Service:

- hibernation (``streams.pyds.dev/hibernation``), for one server and for a 3-replica set:
  every process gone, the claims and the Lease kept, and on waking every acknowledged
  append back through the Service, exactly once, in its writer's order;
- fencing (``streams.pyds.dev/fenced-instances``) of a standby and then of the primary of a
  3-replica set under writers: the fenced pod's process stays (same PID, no restart), its
  segment files do not change while it is fenced, it leaves the Services, the writers go
  on, and once unfenced it is back in sync holding the same bytes as the others;
- a fenced pod deleted under writers: the pod made again starts fenced (the operator's list,
  projected beside its annotations) and its server never opens its storage.

The harness (the API server process, the writers, the convergence check) is
e2e/test_operator_replica_set.py's.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator import KIND
from stream_operator.controllers import replica_set
from stream_operator.decisions.lifecycle import FENCED_INSTANCES, HIBERNATION, POD_FENCED
from stream_operator.specs.render import lease_name, replication_secret_name
from testkit.cluster import Cluster
from testkit.history import History, check
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.ledger import NAME, NS, SPEC, STREAMS, WRITERS, ds_status, settled
from testkit.operator import operated_api_server
from testkit.service_writers import Writers, converged, create_streams, until
from testkit.services import ServiceEndpoints
from testkit.stream_reads import read_served

pytestmark = pytest.mark.processes


def annotate(kube: Cluster, key: str, value: str | None) -> None:
    kube.patch(KIND, NS, NAME, {"metadata": {"annotations": {key: value}}}).raise_for_status()


def condition(kube: Cluster, ctype: str) -> dict[str, Any]:
    return next((c for c in ds_status(kube).get("conditions") or [] if c["type"] == ctype), {})


def events(kube: Cluster, reason: str) -> list[str]:
    return [
        e["message"]
        for e in kube.list("Event", NS)
        if e["involvedObject"]["name"] == NAME and e["reason"] == reason
    ]


def through_service(service: ServiceEndpoints) -> dict[str, bytes] | None:
    """Every stream as the Service's pod serves it now (None: no pod, or not serving)."""
    urls = service.urls()
    if not urls:
        return None
    with httpx.Client(timeout=10) as client:
        try:
            got = {s: read_served(client, f"{urls[0]}/v1/stream/{s}") for s in STREAMS}
        except httpx.HTTPError:
            return None
    return None if any(v is None for v in got.values()) else got  # type: ignore[misc]


def segment_files(data_dir: Path) -> dict[str, tuple[str, int]]:
    """Each file of a data directory: its content's digest and modification time (ns)."""
    return {
        str(p.relative_to(data_dir)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(data_dir.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Cluster]:
    with operated_api_server(tmp_path) as c:
        yield c


@pytest.mark.parametrize("replicas", [1, 3])
def test_hibernation_stops_every_server_keeps_the_data_and_wakes_with_every_write(
    kube: Cluster, tmp_path: Path, replicas: int
) -> None:
    spec = {**SPEC, "replicas": replicas}
    history = History()
    with Kubelet(kube, NS, NAME, tmp_path, restart_delay=1.0) as kubelet:
        replica_set.use_pod_urls(kubelet.pod_url)
        service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of)
        writers = Writers(service, history, WRITERS)
        try:
            kube.create(durable_stream(NAME, spec)).raise_for_status()

            def ready() -> dict[str, Any] | None:
                if replicas > 1:
                    return settled(kube, 1)
                st = ds_status(kube)
                return st if st.get("phase") == "Ready" else None

            until(ready, lambda: f"Ready: {ds_status(kube)}")
            create_streams(service, STREAMS)
            writers.start()
            until(lambda: writers.acked_after(0), "first appends acknowledged")

            # Hibernate under the writers: they find no endpoint and keep retrying.
            lease_before = kube.get("Lease", NS, lease_name(NAME))
            annotate(kube, HIBERNATION, "on")
            until(
                lambda: ds_status(kube).get("phase") == "Hibernated",
                lambda: f"Hibernated: {ds_status(kube)}",
            )
            assert not kubelet.pods and not kube.list("Pod", NS), "every server stopped"
            assert condition(kube, "Hibernated")["status"] == "True"
            claims = kube.list("PersistentVolumeClaim", NS)
            assert len(claims) == replicas, [c["metadata"]["name"] for c in claims]
            assert kube.get("StatefulSet", NS, NAME)["spec"]["replicas"] == 0
            if replicas > 1:
                lease = kube.get("Lease", NS, lease_name(NAME))
                assert lease is not None and lease_before is not None  # the Lease is kept
                assert kube.http is not None  # and the peer token
                secret = f"/api/v1/namespaces/{NS}/secrets/{replication_secret_name(NAME)}"
                assert kube.http.get(secret).status_code == 200
            asleep = time.monotonic()
            assert events(kube, "Hibernated")

            annotate(kube, HIBERNATION, "off")
            until(ready, lambda: f"Ready after waking: {ds_status(kube)}")
            writers.resumed(asleep, "waking")
            assert condition(kube, "Hibernated")["reason"] == "Awake"
        finally:
            writers.stop.set()
            history.dump(tmp_path / "history.jsonl")
        writers.finish()
        final = converged(kubelet, STREAMS, replicas) if replicas > 1 else None
        served = until(lambda: through_service(service), "the streams through the Service")
        if final is not None:
            assert served == final
    report = check(history, served)
    print(f"\nhistory ({replicas} replicas, hibernated and woken): {report.summary()}")
    assert report.ok, f"{report.summary()} (history in {tmp_path / 'history.jsonl'})"
    assert report.acknowledged > 0


def test_fenced_pods_keep_their_process_and_storage_and_come_back_in_sync(
    kube: Cluster, tmp_path: Path
) -> None:
    history = History()
    with Kubelet(kube, NS, NAME, tmp_path, restart_delay=1.0) as kubelet:
        replica_set.use_pod_urls(kubelet.pod_url)
        service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of)
        writers = Writers(service, history, WRITERS)
        try:
            kube.create(durable_stream(NAME, SPEC)).raise_for_status()
            first = until(lambda: settled(kube, 1), lambda: f"a primary: {ds_status(kube)}")
            create_streams(service, STREAMS)
            writers.start()
            until(lambda: writers.acked_after(0), "first appends acknowledged")
            standby = next(r["name"] for r in first["replicaStatus"] if r["role"] == "standby")
            fence_and_lift(kube, kubelet, writers, standby)
            now = until(lambda: settled(kube, 1), lambda: f"settled: {ds_status(kube)}")
            fence_and_lift(kube, kubelet, writers, now["primary"])
            fence_all_and_lift(kube, kubelet, writers)
        finally:
            writers.stop.set()
            history.dump(tmp_path / "history.jsonl")
        writers.finish()
        final = converged(kubelet, STREAMS, 3)
    report = check(history, final)
    print(f"\nhistory (a standby, then the primary fenced): {report.summary()}")
    assert report.ok, f"{report.summary()} (history in {tmp_path / 'history.jsonl'})"
    assert report.acknowledged > 0


def fence_all_and_lift(kube: Cluster, kubelet: Kubelet, writers: Writers) -> None:
    """``["*"]``: every server fenced at once (the primary's hand-over may go to a standby
    being fenced too), no storage written, and the set back whole once lifted."""
    pods = dict(kubelet.pods)
    pids = {o: p.proc.pid for o, p in pods.items()}
    annotate(kube, FENCED_INSTANCES, '["*"]')

    def all_fenced() -> bool:
        for p in pods.values():
            try:
                r = httpx.get(f"{p.url}/readyz", timeout=5)
            except httpx.HTTPError:
                return False
            if r.status_code != 503 or r.json().get("fenced") is not True:
                return False
        return not any(p.ready for p in pods.values())

    until(all_fenced, "every pod fenced")
    before = {o: segment_files(p.data_dir) for o, p in pods.items()}
    until(lambda: "every pod" in condition(kube, "Fenced").get("message", ""), "Fenced: all")
    assert {o: segment_files(p.data_dir) for o, p in pods.items()} == before
    lifted = time.monotonic()
    annotate(kube, FENCED_INSTANCES, None)
    until(lambda: not condition(kube, "Fenced"), "the Fenced condition gone")
    until(lambda: all(p.ready for p in pods.values()), "every pod serving again, ready")
    until(lambda: settled(kube, 1), lambda: f"settled after the fence: {ds_status(kube)}")
    until(lambda: writers.acked_after(lifted), "appends acknowledged after the fence")
    assert {o: p.proc.pid for o, p in kubelet.pods.items()} == pids  # no pod restarted


def fence_and_lift(kube: Cluster, kubelet: Kubelet, writers: Writers, pod: str) -> None:
    """Fence ``pod`` under the writers, check what a fence promises, and lift it."""
    ordinal = int(pod.rsplit("-", 1)[1])
    running = kubelet.pods[ordinal]
    pid, restarts = running.proc.pid, running.restarts
    annotate(kube, FENCED_INSTANCES, json.dumps([pod]))

    def fenced() -> bool:
        try:
            r = httpx.get(f"{running.url}/readyz", timeout=5)
        except httpx.HTTPError:
            return False
        in_api = kube.get("Pod", NS, pod) or {}
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (in_api.get("status") or {}).get("conditions") or []
        )
        return r.status_code == 503 and r.json().get("fenced") is True and not ready

    until(fenced, f"{pod} fenced and not ready")
    until(lambda: condition(kube, "Fenced").get("status") == "True", "the Fenced condition")
    assert any(pod in m for m in events(kube, "Fenced"))
    # A fenced primary handed the Lease over: a new term, another primary.
    after = until(
        lambda: (st := ds_status(kube)).get("primary") not in (None, pod) and st,
        lambda: f"a primary other than {pod}: {ds_status(kube)}",
    )
    assert after["primary"] != pod
    before = segment_files(running.data_dir)
    fenced_at = time.monotonic()
    until(lambda: writers.acked_after(fenced_at), f"appends acknowledged while {pod} is fenced")
    assert segment_files(running.data_dir) == before, "the fenced pod's storage changed"
    r = httpx.post(f"{running.url}/v1/stream/{STREAMS[0]}", content=b"x", timeout=5)
    assert r.status_code == 503 and r.json()["error"]["code"] == "FENCED"
    assert running.proc.poll() is None and running.proc.pid == pid
    assert kubelet.pods[ordinal] is running and running.restarts == restarts  # no restart

    annotate(kube, FENCED_INSTANCES, None)
    until(lambda: not condition(kube, "Fenced"), "the Fenced condition gone")
    until(lambda: running.ready, f"{pod} serving again, ready")
    until(
        lambda: (
            (st := settled(kube, 1, after_term=0))
            and any(r["name"] == pod and r["inSync"] for r in st["replicaStatus"])
            and st
        ),
        lambda: f"{pod} back in sync: {ds_status(kube)}",
    )
    assert running.proc.pid == pid and running.restarts == restarts


def test_a_fenced_pod_made_again_starts_fenced_and_never_opens_its_storage(
    kube: Cluster, tmp_path: Path
) -> None:
    """Before the operator's list, the new pod had no fence annotation until the
    operator's next round: its server opened its storage (a standby followed the primary)
    and only then started again fenced."""
    history = History()
    with Kubelet(kube, NS, NAME, tmp_path, restart_delay=1.0) as kubelet:
        replica_set.use_pod_urls(kubelet.pod_url)
        service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of)
        writers = Writers(service, history, WRITERS)
        try:
            kube.create(durable_stream(NAME, SPEC)).raise_for_status()
            first = until(lambda: settled(kube, 1), lambda: f"a primary: {ds_status(kube)}")
            create_streams(service, STREAMS)
            writers.start()
            until(lambda: writers.acked_after(0), "first appends acknowledged")
            standby = next(r["name"] for r in first["replicaStatus"] if r["role"] == "standby")
            ordinal = int(standby.rsplit("-", 1)[1])
            old = kubelet.pods[ordinal]
            annotate(kube, FENCED_INSTANCES, json.dumps([standby]))
            until(lambda: _answer(old.url) == "fenced", f"{standby} fenced")
            before = segment_files(old.data_dir)

            kube.delete("Pod", NS, standby).raise_for_status()  # kubectl delete pod
            new = until(
                lambda: (p := kubelet.pods.get(ordinal)) is not old and p, f"{standby} again"
            )
            answers: list[str] = []

            def answered() -> bool:
                answers.append(_answer(new.url))
                return answers[-1] != "no answer"

            until(answered, f"the new {standby}'s first answer")
            # The operator has seen the new pod (and fenced it the way it knows of).
            until(
                lambda: _annotation(kube, standby) == "true",
                f"the fence annotation on the new {standby}",
            )
            later = time.monotonic()
            until(lambda: writers.acked_after(later), "appends acknowledged meanwhile")
            answers.append(_answer(new.url))
            assert set(answers) - {"no answer"} == {"fenced"}, answers
            assert new.data_dir == old.data_dir
            assert segment_files(new.data_dir) == before, "the new pod opened its storage"
            with new.log_path.open("rb") as f:
                f.seek(new.log_start)
                log = f.read().decode(errors="replace")
            assert "not opening" in log and "starting again" not in log, log[-3000:]
            assert new.proc.poll() is None and kubelet.pods[ordinal] is new

            annotate(kube, FENCED_INSTANCES, None)
            until(lambda: new.ready, f"{standby} serving again, ready")
            until(lambda: settled(kube, 1), lambda: f"settled after the fence: {ds_status(kube)}")
        finally:
            writers.stop.set()
            history.dump(tmp_path / "history.jsonl")
        writers.finish()
        final = converged(kubelet, STREAMS, 3)
    report = check(history, final)
    assert report.ok, f"{report.summary()} (history in {tmp_path / 'history.jsonl'})"


def _answer(url: str) -> str:
    """What a server's /readyz says: "fenced", "ready", "not ready" or "no answer"."""
    try:
        r = httpx.get(f"{url}/readyz", timeout=5)
    except httpx.HTTPError:
        return "no answer"
    if r.status_code == 503 and r.json().get("fenced") is True:
        return "fenced"
    return "ready" if r.status_code == 200 else "not ready"


def _annotation(kube: Cluster, pod: str) -> str | None:
    meta = (kube.get("Pod", NS, pod) or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(POD_FENCED)
