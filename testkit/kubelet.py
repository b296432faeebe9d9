"""Play the StatefulSet controller and the kubelet for one StatefulSet, with real processes.

When the operator's StatefulSet appears in the emulated API server, each of
its pods becomes a real ``stream_server`` process: the container's args after
the image's entrypoint (``durable-streams-server``), the env from its
``envFrom`` ConfigMap, and its own directory as the ``data`` volume (one per
PVC, kept across pod restarts as a volume is). Host, port and data path are
the only things translated, because a pod's network and mounts cannot be
here. Readiness comes from the rendered readiness probe, and the counts go
back into the StatefulSet's status the way the controller reports them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
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
    """The StatefulSet controller's part: one PVC per claim template and ordinal."""
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    for template in sts["spec"].get("volumeClaimTemplates") or []:
        for ordinal in range(int(sts["spec"].get("replicas", 1))):
            pvc_name = f"{template['metadata']['name']}-{name}-{ordinal}"
            if cluster.get("PersistentVolumeClaim", namespace, pvc_name) is None:
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

    def _start(self, ordinal: int, template: dict[str, Any], revision: str) -> Pod:
        container = template["spec"]["containers"][0]
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef")
            if ref:
                cm = self.cluster.get("ConfigMap", self.namespace, ref["name"]) or {}
                env.update(cm.get("data") or {})
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
        data_dir = self.root / f"data-{self.name}-{ordinal}"  # the PVC, as a directory
        data_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env.update(DS_HOST="127.0.0.1", DS_PORT=str(port), DS_DATA_DIR=str(data_dir))
        log_path = self.root / f"{self.name}-{ordinal}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_server", *container.get("args", [])],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
        probe = container.get("readinessProbe", {}).get("httpGet", {}).get("path", "/readyz")
        return Pod(ordinal, revision, data_dir, port, proc, log_path, probe)
