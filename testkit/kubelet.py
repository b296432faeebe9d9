"""Play the StatefulSet controller and the kubelet for one StatefulSet, with real processes.

When the operator's StatefulSet appears in the emulated API server, each of
its pods becomes a real ``stream_server`` process: the container's args after
the image's entrypoint (``durable-streams-server``), the env from its
``envFrom`` ConfigMap, and its own directory as the ``data`` volume (one per
PVC, kept across pod restarts as a volume is). Host, port and data path are
the only things translated, because a pod's network and mounts cannot be
here. Readiness comes from the rendered readiness probe, and the counts go
back into the StatefulSet's status the way the controller reports them.

Each pod is also a Pod object in the API with the container status a kubelet
reports (ready, restartCount, state, lastState): a server that exits is
restarted after a doubling back-off (CrashLoopBackOff meanwhile), and under
``terminationMessagePolicy: FallbackToLogsOnError`` the end of its log is the
last state's message, which is what the operator's status reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testkit import free_port
from testkit.cluster import Cluster


def claim_volumes(cluster: Cluster, sts: dict[str, Any]) -> None:
    """The StatefulSet controller's part: one PVC per claim template and ordinal, made
    from the StatefulSet's template as it is (its size included).

    Then the volume controllers' part: each claim is bound with the capacity it asks
    for, and a claim whose request grew gets that capacity (the external resizer and
    the kubelet's file-system expansion, done). Until a test calls this again, a grown
    claim still holds its old capacity, as a real one does while it resizes.
    """
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    for template in sts["spec"].get("volumeClaimTemplates") or []:
        for ordinal in range(int(sts["spec"].get("replicas", 1))):
            pvc_name = f"{template['metadata']['name']}-{name}-{ordinal}"
            pvc = cluster.get("PersistentVolumeClaim", namespace, pvc_name)
            if pvc is None:
                pvc = {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": pvc_name,
                        "namespace": namespace,
                        "labels": template["metadata"].get("labels") or {},
                    },
                    "spec": template["spec"],
                }
                cluster.create(pvc).raise_for_status()
            request = pvc["spec"]["resources"]["requests"]["storage"]
            if ((pvc.get("status") or {}).get("capacity") or {}).get("storage") != request:
                bound = {"phase": "Bound", "capacity": {"storage": request}}
                cluster.patch(
                    "PersistentVolumeClaim", namespace, pvc_name, {"status": bound}, status=True
                ).raise_for_status()


# What FallbackToLogsOnError keeps of a log as the termination message (kubelet's limits).
MESSAGE_LINES = 80
MESSAGE_BYTES = 2048


def termination_message(log: bytes) -> str:
    """The kubelet's termination message for a container that failed without writing
    /dev/termination-log, under ``terminationMessagePolicy: FallbackToLogsOnError``:
    the last 80 lines of its log, at most the last 2048 bytes."""
    tail = b"\n".join(log.rstrip(b"\n").split(b"\n")[-MESSAGE_LINES:])[-MESSAGE_BYTES:]
    return tail.decode("utf-8", "replace")


def container_env(
    cluster: Cluster, namespace: str, container: dict[str, Any], pod: str
) -> dict[str, str]:
    """The environment the kubelet gives ``container`` in pod ``pod``: its ConfigMaps, then
    ``env`` in order, ``metadata.name`` from the downward API and ``$(VAR)`` expanded
    from the variables defined before it (as the kubelet does)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        if ref:
            cm = cluster.get("ConfigMap", namespace, ref["name"]) or {}
            env.update(cm.get("data") or {})
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                var["value"],
            )
        elif (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = pod
    return env


def pod_object(sts: dict[str, Any], ordinal: int) -> dict[str, Any]:
    """The pod the StatefulSet controller makes for ``ordinal`` (without its status)."""
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    template = sts["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{ordinal}",
            "namespace": namespace,
            "labels": template["metadata"].get("labels") or {},
        },
        "spec": template["spec"],
    }


def pod_status(
    container: dict[str, Any],
    *,
    ready: bool,
    restarts: int,
    waiting: tuple[str, str] | None = None,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod's status as the kubelet reports it for its one container: running, or
    waiting with (reason, message); ``last`` the previous run's ``terminated`` state."""
    state: dict[str, Any] = {"running": {}}
    if waiting is not None:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {
                "name": container["name"],
                "ready": ready,
                "restartCount": restarts,
                "image": container["image"],
                "imageID": "",
                "containerID": "",
                "state": state,
                "lastState": {"terminated": last} if last else {},
            }
        ],
    }


def failed_pod(
    sts: dict[str, Any],
    ordinal: int,
    *,
    exit_code: int,
    message: str,
    reason: str = "Error",
    restarts: int = 3,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A StatefulSet pod whose server container keeps failing, and its status as the
    kubelet reports it: waiting in CrashLoopBackOff, the last run terminated with
    ``exit_code`` and ``message`` (``reason`` "OOMKilled" when the kernel killed it)."""
    container = sts["spec"]["template"]["spec"]["containers"][0]
    back_off = f"back-off 40s restarting failed container={container['name']}"
    status = pod_status(
        container,
        ready=False,
        restarts=restarts,
        waiting=("CrashLoopBackOff", back_off),
        last={"exitCode": exit_code, "reason": reason, "message": message},
    )
    return pod_object(sts, ordinal), status


def statefulset_status(
    sts: dict[str, Any], pods: int, ready: int, updated: int, current: str, update: str
) -> dict[str, Any]:
    """The status a StatefulSet controller reports for what it sees of its pods."""
    return {
        "observedGeneration": sts["metadata"].get("generation"),
        "replicas": pods,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": pods,
        "updatedReplicas": updated,
        "currentRevision": current,
        "updateRevision": update,
    }


@dataclass
class Pod:
    ordinal: int
    revision: str
    data_dir: Path
    port: int
    proc: subprocess.Popen
    log_path: Path
    probe_path: str
    ready: bool = False
    log_start: int = 0  # where this run's output starts in log_path
    restarts: int = 0
    last: dict[str, Any] | None = None  # the previous run's terminated state
    back_off_until: float = 0.0  # exited: restarted at this time (CrashLoopBackOff)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def probe(self) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            return httpx.get(self.url + self.probe_path, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Kubelet:
    cluster: Cluster
    namespace: str
    name: str
    root: Path
    # How long a deleted pod stays away before its replacement starts (scheduling, pulling).
    restart_delay: float = 3.0
    pods: dict[int, Pod] = field(default_factory=dict)
    _away_until: dict[int, float] = field(default_factory=dict)
    _published: dict[int, dict[str, Any]] = field(default_factory=dict)  # pod statuses
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    # -- the test's controls ------------------------------------------------------------

    def __enter__(self) -> Kubelet:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kubelet")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(30)
        for pod in list(self.pods.values()):
            pod.stop()

    def delete_pod(self, ordinal: int) -> None:
        """The pod dies (SIGKILL) and its replacement comes ``restart_delay`` later."""
        with self._lock:
            pod = self.pods.pop(ordinal)
            self._away_until[ordinal] = time.monotonic() + self.restart_delay
        pod.stop(signal.SIGKILL)

    def ready_pods(self) -> list[Pod]:
        with self._lock:
            return [p for p in self.pods.values() if p.ready]

    # -- the controller -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            # The API server may go away first at the end of a test.
            with contextlib.suppress(httpx.HTTPError):
                self.sync()
            self._stop.wait(0.2)

    def sync(self) -> None:
        sts = self.cluster.get("StatefulSet", self.namespace, self.name)
        if sts is None:
            with self._lock:
                for ordinal in list(self.pods):
                    self.pods.pop(ordinal).stop()
            self._publish(None, {})
            return
        spec = sts["spec"]
        want = int(spec.get("replicas", 1))
        template = spec["template"]
        revision = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        claim_volumes(self.cluster, sts)
        with self._lock:
            for ordinal in [o for o in self.pods if o >= want]:
                self.pods.pop(ordinal).stop()  # scaled down
            stale = sorted(
                (o for o, p in self.pods.items() if p.revision != revision), reverse=True
            )
            all_ready = all(self.pods.get(o) and self.pods[o].ready for o in range(want))
            if stale and all_ready:
                # Rolling update: one pod at a time, highest ordinal first.
                self.pods.pop(stale[0]).stop()
            for ordinal in range(want):
                if ordinal not in self.pods and time.monotonic() >= self._away_until.get(
                    ordinal, 0
                ):
                    self.pods[ordinal] = self._start(ordinal, template, revision)
            self._restart_exited(template, revision)
            for pod in self.pods.values():
                pod.ready = pod.probe()
            pods = dict(self.pods)
            # A deleted pod's replacement exists at once, Pending until its delay is over.
            pending = [o for o in range(want) if o not in pods]
        ready = sum(1 for p in pods.values() if p.ready)
        updated = sum(1 for p in pods.values() if p.revision == revision) + len(pending)
        count = len(pods) + len(pending)
        current_revision = revision if updated == count == want else f"{self.name}-previous"
        status = statefulset_status(sts, count, ready, updated, current_revision, revision)
        if status != {k: (sts.get("status") or {}).get(k) for k in status}:
            self.cluster.patch(
                "StatefulSet", self.namespace, self.name, {"status": status}, status=True
            )
        self._publish(sts, pods)

    def _restart_exited(self, template: dict[str, Any], revision: str) -> None:
        """restartPolicy Always: a server that exited is recorded (exit code, and the end
        of its log as the message under FallbackToLogsOnError) and started again after a
        back-off that doubles each time, as the kubelet's CrashLoopBackOff does."""
        container = template["spec"]["containers"][0]
        now = time.monotonic()
        for ordinal, pod in list(self.pods.items()):
            code = pod.proc.poll()
            if code is not None and not pod.back_off_until:
                message = ""
                policy = container.get("terminationMessagePolicy", "File")
                if code != 0 and policy == "FallbackToLogsOnError":
                    with open(pod.log_path, "rb") as f:
                        f.seek(pod.log_start)
                        message = termination_message(f.read())
                reason = "Completed" if code == 0 else "Error"
                pod.last = {"exitCode": code, "reason": reason, "message": message}
                pod.restarts += 1
                pod.back_off_until = now + self.restart_delay * 2 ** min(pod.restarts - 1, 5)
            elif pod.back_off_until and now >= pod.back_off_until and pod.revision == revision:
                # (A pod of an older revision stays down, as a real StatefulSet's broken
                # pod does until it is deleted.)
                new = self._start(ordinal, template, revision)
                new.restarts, new.last = pod.restarts, pod.last
                self.pods[ordinal] = new

    def _publish(self, sts: dict[str, Any] | None, pods: dict[int, Pod]) -> None:
        """The pods as Pod objects in the API, their status as the kubelet reports it."""
        for ordinal in [o for o in self._published if o not in pods]:
            self.cluster.delete("Pod", self.namespace, f"{self.name}-{ordinal}")
            del self._published[ordinal]
        if sts is None:
            return
        container = sts["spec"]["template"]["spec"]["containers"][0]
        for ordinal, pod in sorted(pods.items()):
            name = f"{self.name}-{ordinal}"
            waiting = None
            if pod.back_off_until:
                why = f"back-off restarting failed container={container['name']} pod={name}"
                waiting = ("CrashLoopBackOff", why)
            status = pod_status(
                container, ready=pod.ready, restarts=pod.restarts, waiting=waiting, last=pod.last
            )
            if self._published.get(ordinal) == status:
                continue
            if ordinal not in self._published:
                self.cluster.delete("Pod", self.namespace, name)  # a replaced pod
                self.cluster.create(pod_object(sts, ordinal)).raise_for_status()
            self.cluster.patch(
                "Pod", self.namespace, name, {"status": status}, status=True
            ).raise_for_status()
            self._published[ordinal] = status

    def _start(self, ordinal: int, template: dict[str, Any], revision: str) -> Pod:
        container = template["spec"]["containers"][0]
        env = container_env(self.cluster, self.namespace, container, f"{self.name}-{ordinal}")
        data_dir = self.root / f"data-{self.name}-{ordinal}"  # the PVC, as a directory
        data_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env.update(DS_HOST="127.0.0.1", DS_PORT=str(port), DS_DATA_DIR=str(data_dir))
        log_path = self.root / f"{self.name}-{ordinal}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
        log_start = log.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_server", *container.get("args", [])],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
        probe = container.get("readinessProbe", {}).get("httpGet", {}).get("path", "/readyz")
        return Pod(ordinal, revision, data_dir, port, proc, log_path, probe, log_start=log_start)
