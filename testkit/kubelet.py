"""Play the StatefulSet controller and the kubelet for one StatefulSet, with real servers.

When the operator's StatefulSet appears in the emulated API server, each of
its pods becomes a real server, a ``stream_server`` process or a container of
the server image (``runtime``): the container's args after the image's
entrypoint (``durable-streams-server``), the env from its ``envFrom``
ConfigMap, and its own directory as the ``data`` volume (one per PVC, kept
across pod restarts as a volume is; a pod waits for its claim to be bound, and
a claim deleted through the API and made again gets a new, empty directory, as
a dynamically provisioned volume is: ``pod_objects.volume_dir``). The host and port are set for it (every
pod is on 127.0.0.1, each on its own port), because a pod network cannot be
here. Readiness comes from the rendered readiness probe, and the counts go
back into the StatefulSet's status the way the controller reports them.

Each pod is also a Pod object in the API with the container status a kubelet
reports (ready, restartCount, state, lastState): a server that exits is
restarted after a doubling back-off (CrashLoopBackOff meanwhile), and under
``terminationMessagePolicy: FallbackToLogsOnError`` the end of its log is the
last state's message, which is what the operator's status reads.

What the controller does with a changed template follows ``updateStrategy``:
``RollingUpdate`` replaces the highest stale ordinal at or above the
``partition`` once every pod is ready; ``OnDelete`` replaces a pod only when
someone deletes its Pod object (the operator does, for a replica set). A pod
deleted through the API gets SIGTERM, SIGKILL after its grace period, and its
replacement starts only once it has exited (one process per volume). Pods carry
``controller-revision-hash``, as the operator's rollout reads it.

A replica set's pods get what only the stand-in knows: ``DS_KUBE_API`` (the
emulated API server, where a pod would use its service account) and
``DS_REPLICA_URL`` (the pod's own 127.0.0.1 origin, where a pod would be reached
through the headless Service); mounted Secrets are written to files, which the
runtime (``testkit.pod_runtimes``: a process, or a podman container) gives the
server at their paths. Readiness honours the readiness
probe's period, timeout and failure threshold, and a pod's Ready condition its
``readinessGates`` too, as the kubelet's: Ready once the container is and every
gate's condition (set by someone else through ``pods/status``, kept as set) is True.

The API objects themselves (claims, Pod objects and statuses, the StatefulSet's
status, a container's env) are built in ``testkit.pod_objects``; how a container
runs is ``testkit.pod_runtimes``; this module decides when each starts and stops.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from testkit import free_port
from testkit.cluster import Cluster
from testkit.init_containers import init_status, replacing_states
from testkit.pod_objects import (
    claim_name,
    claim_volumes,
    container_env,
    downward_volumes,
    gates_not_ready,
    pod_object,
    pod_status,
    readiness_gates,
    refresh_downward,
    secret_volumes,
    statefulset_status,
    template_revision,
    termination_message,
    volume_dir,
)
from testkit.pod_projected import projected_volumes
from testkit.pod_runtimes import ContainerLaunch, Processes, Running, Runtime
from testkit.pod_secrets import ContainerConfigError


@dataclass
class Pod:
    ordinal: int
    revision: str
    data_dir: Path
    port: int
    proc: Running
    log_path: Path
    probe_path: str
    ready: bool = False
    log_start: int = 0  # where this run's output starts in log_path
    restarts: int = 0
    last: dict[str, Any] | None = None  # the previous run's terminated state
    back_off_until: float = 0.0  # exited: restarted at this time (CrashLoopBackOff)
    grace: float = 30.0  # terminationGracePeriodSeconds: SIGTERM, then SIGKILL this later
    failure_threshold: int = 1  # the readiness probe's failureThreshold
    probe_period: float = 0.0  # its periodSeconds (0: on every round of the stand-in)
    probe_timeout: float = 1.0  # its timeoutSeconds
    next_probe: float = 0.0
    failures: int = 0  # readiness probes failed in a row
    kill_at: float = 0.0  # terminating: SIGKILL at this time
    scheme: str = "http"  # the readiness probe's: https when the server serves TLS
    gates: list[str] = field(default_factory=list)  # its readinessGates' condition types
    gates_met: bool = True  # every gate's condition True in the API (as last listed)
    # The init container running (its index in initContainers); None: the server runs.
    init_step: int | None = None
    init_restarts: int = 0  # the init containers' restarts (back-off after a failure)
    init_last: dict[str, Any] | None = None  # the failed init container's terminated state

    @property
    def pod_ready(self) -> bool:
        """The pod's Ready condition: its container ready and every readiness gate met."""
        return self.ready and self.gates_met

    # Its downward API files (downwardAPI and projected volumes): (local file, fieldPath),
    # rewritten as the pod changes.
    downward: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def probe(self) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            # The kubelet does not check the certificate of an HTTPS probe.
            answer = httpx.get(self.url + self.probe_path, timeout=self.probe_timeout, verify=False)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def probe_due(self) -> None:
        """Run the readiness probe if its period is over since the last one; a container
        that exited is not ready at once (the kubelet sees it exit, no probe needed)."""
        now = time.monotonic()
        if self.init_step is not None:  # no probe before the init containers are done
            self.ready = False
        elif self.proc.poll() is not None:
            self.observe(False)
        elif now >= self.next_probe:
            self.next_probe = now + self.probe_period
            self.observe(self.probe())

    def observe(self, success: bool) -> None:
        """Readiness as the kubelet judges it from probe results: ready on a success, not
        ready after ``failure_threshold`` failures in a row, or at once when the container
        has exited (one slow answer from a busy server does not take it out of its
        Services)."""
        if success:
            self.ready, self.failures = True, 0
            return
        self.failures += 1
        if self.failures >= self.failure_threshold or self.proc.poll() is not None:
            self.ready = False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM now, SIGKILL once the grace period is over (``Kubelet._reap``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.kill_at = time.monotonic() + self.grace


@dataclass
class Kubelet:
    cluster: Cluster
    namespace: str
    name: str
    root: Path
    # How long a deleted pod stays away before its replacement starts (scheduling, pulling).
    restart_delay: float = 3.0
    # Called with a pod just before it is sent SIGTERM for a rollout, a scale-down or a
    # deletion through the API: a test notes what the pod was doing then.
    before_stop: Callable[[Pod], None] | None = None
    # How a pod's container runs: a process of this checkout, or the image under podman.
    runtime: Runtime = field(default_factory=Processes)
    # A replica set's peers reach a pod by the name in its rendered DS_REPLICA_URL
    # (``<pod>.<name>-headless.<ns>.svc``, which TLS checks against its certificate), on
    # the pod's port; the test makes those names resolve (testkit.hosts). Otherwise
    # they reach it at 127.0.0.1.
    pod_hostnames: bool = False
    pods: dict[int, Pod] = field(default_factory=dict)
    # Every stop and start, in order: (monotonic time, "stop"|"start", ordinal, revision).
    history: list[tuple[float, str, int, str]] = field(default_factory=list)
    _terminating: dict[int, Pod] = field(default_factory=dict)  # SIGTERM sent, not exited
    _away_until: dict[int, float] = field(default_factory=dict)
    _published: dict[int, dict[str, Any]] = field(default_factory=dict)  # pod statuses
    _uids: dict[int, str] = field(default_factory=dict)  # the Pod objects this kubelet runs
    _templates: dict[str, dict[str, Any]] = field(default_factory=dict)  # by revision
    _claimed_at: float = float("-inf")
    _ran: dict[int, str] = field(default_factory=dict)  # the revision each ordinal last ran
    api_errors: list[str] = field(default_factory=list)  # the last few, for a failure
    # Pods whose container cannot be made: pod name -> why (CreateContainerConfigError).
    waiting: dict[str, str] = field(default_factory=dict)
    failure: Exception | None = None  # what stopped the stand-in's loop, raised at exit
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
        for pod in [*self.pods.values(), *self._terminating.values()]:
            pod.stop()
        if self.failure is not None:
            raise RuntimeError(f"the kubelet stand-in failed: {self.failure!r}") from self.failure

    def delete_pod(self, ordinal: int) -> None:
        """The pod dies (SIGKILL) and its replacement comes ``restart_delay`` later."""
        with self._lock:
            pod = self.pods.pop(ordinal)
            self._away_until[ordinal] = time.monotonic() + self.restart_delay
            self.history.append((time.monotonic(), "stop", ordinal, pod.revision))
        pod.stop(signal.SIGKILL)

    def kill(self, ordinal: int, sig: int = signal.SIGKILL) -> None:
        """Signal the server process in the pod (``kill -9`` inside the container): the pod
        stays, and its container is restarted as ``restartPolicy: Always`` restarts it."""
        with self._lock:
            self.pods[ordinal].proc.send_signal(sig)

    def ready_pods(self) -> list[Pod]:
        """The pods whose Ready condition is True (readiness gates included)."""
        with self._lock:
            return [p for p in self.pods.values() if p.pod_ready]

    def pod_url(self, _name: str, _namespace: str, pod_name: str, _spec: object) -> str:
        """Where the operator reaches a pod (``replica_set.use_pod_urls``), as cluster DNS
        would resolve its name through the headless Service; a pod not running: an
        address nothing answers at."""
        return self.url_of(pod_name) or "http://0.0.0.0:9"

    def url_of(self, pod_name: str) -> str | None:
        """Where the pod named ``pod_name`` listens now (its address, as a pod IP and the
        container port would give it), or None when no process runs for it."""
        prefix = f"{self.name}-"
        if not pod_name.startswith(prefix) or not pod_name[len(prefix) :].isdigit():
            return None
        with self._lock:
            pod = self.pods.get(int(pod_name[len(prefix) :]))
            return pod.url if pod is not None and pod.proc.poll() is None else None

    # -- the controller -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except httpx.HTTPError as exc:  # e.g. the API server went away first at the end
                self.api_errors.append(f"{type(exc).__name__}: {exc}")
                del self.api_errors[:-20]
            except Exception as exc:  # a bug here: the test fails with it (__exit__)
                self.failure = exc
                return
            self._stop.wait(0.2)

    def sync(self) -> None:  # noqa: C901 - one control loop's round, in the StatefulSet controller's order
        sts = self.cluster.get("StatefulSet", self.namespace, self.name)
        if sts is None:
            with self._lock:
                for ordinal in list(self.pods):
                    self.pods.pop(ordinal).stop()
                for ordinal in list(self._terminating):
                    self._terminating.pop(ordinal).stop(signal.SIGKILL)
            self._publish(None, {})
            return
        spec = sts["spec"]
        want = int(spec.get("replicas", 1))
        template = spec["template"]
        revision = template_revision(sts)
        self._templates[revision] = template
        strategy = spec.get("updateStrategy") or {"type": "RollingUpdate"}
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        if time.monotonic() - self._claimed_at >= 1.0:  # the volume controllers' pace
            claim_volumes(self.cluster, sts)
            self._claimed_at = time.monotonic()
        selector = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
        listed = {
            p["metadata"]["name"]: p for p in self.cluster.list("Pod", self.namespace, selector)
        }
        in_api = {name: p["metadata"].get("uid") for name, p in listed.items()}
        # The conditions others set (a readiness gate's), by the uid they were set on.
        conditions = {
            (name, p["metadata"].get("uid")): (p.get("status") or {}).get("conditions") or []
            for name, p in listed.items()
        }
        with self._lock:
            self._reap()
            for ordinal, uid in list(self._uids.items()):
                if in_api.get(f"{self.name}-{ordinal}") != uid:
                    # Deleted through the API (the operator, a user): its process goes,
                    # and the StatefulSet controller makes the pod again.
                    del self._uids[ordinal]
                    self._published.pop(ordinal, None)
                    if ordinal in self.pods:
                        self._terminate(ordinal)
            for ordinal in [o for o in self.pods if o >= want]:
                self._delete(ordinal)  # scaled down
            if strategy.get("type", "RollingUpdate") == "RollingUpdate":
                stale = sorted(
                    (o for o, p in self.pods.items() if p.revision != revision and o >= partition),
                    reverse=True,
                )
                all_ready = all(self.pods.get(o) and self.pods[o].pod_ready for o in range(want))
                if stale and all_ready and not self._terminating:
                    # Rolling update: one pod at a time, highest ordinal first.
                    self._delete(stale[0])
            for ordinal in range(want):
                if (
                    ordinal not in self.pods
                    and ordinal not in self._terminating
                    and time.monotonic() >= self._away_until.get(ordinal, 0)
                ):
                    # Below a RollingUpdate's partition a pod comes back as it was.
                    was = self._ran.get(ordinal, revision)
                    keep = ordinal < partition and was in self._templates
                    started = (
                        self._start(ordinal, self._templates[was], was)
                        if keep
                        else self._start(ordinal, template, revision)
                    )
                    if started is not None:
                        self.pods[ordinal] = started
            self._advance_inits()
            self._restart_exited(template, revision)
            for ordinal, pod in self.pods.items():
                seen = listed.get(f"{self.name}-{ordinal}")
                if (
                    pod.downward
                    and seen is not None
                    and self._uids.get(ordinal) == seen["metadata"].get("uid")
                ):
                    # The kubelet rewrites a downwardAPI volume when the pod changes.
                    refresh_downward(pod.downward, seen["metadata"])
                pod.probe_due()
                gated = conditions.get((f"{self.name}-{ordinal}", self._uids.get(ordinal)), [])
                pod.gates_met = gates_not_ready(pod.gates, gated) is None
            pods = dict(self.pods)
            # A deleted pod's replacement exists at once, Pending until its delay is over.
            pending = [o for o in range(want) if o not in pods]
        ready = sum(1 for p in pods.values() if p.pod_ready)
        updated = sum(1 for p in pods.values() if p.revision == revision) + len(pending)
        count = len(pods) + len(pending)
        older = sorted({p.revision for p in pods.values()} - {revision})
        current_revision = older[0] if older else revision
        status = statefulset_status(sts, count, ready, updated, current_revision, revision)
        if status != {k: (sts.get("status") or {}).get(k) for k in status}:
            self.cluster.patch(
                "StatefulSet", self.namespace, self.name, {"status": status}, status=True
            )
        self._publish(sts, pods, conditions)

    def _terminate(self, ordinal: int) -> None:
        """Take the pod's process down gracefully (SIGTERM, SIGKILL after its grace
        period); its replacement starts only once it has exited, as a StatefulSet never
        runs two pods of one ordinal (they would share the volume)."""
        pod = self.pods.pop(ordinal)
        if self.before_stop is not None:
            self.before_stop(pod)
        self.history.append((time.monotonic(), "stop", ordinal, pod.revision))
        pod.terminate()
        self._terminating[ordinal] = pod

    def _delete(self, ordinal: int) -> None:
        """The StatefulSet controller deletes the pod (a rollout, a scale-down)."""
        self._terminate(ordinal)
        if self._uids.pop(ordinal, None) is not None:
            self.cluster.delete("Pod", self.namespace, f"{self.name}-{ordinal}")
        self._published.pop(ordinal, None)

    def _reap(self) -> None:
        for ordinal, pod in list(self._terminating.items()):
            if pod.proc.poll() is not None:
                del self._terminating[ordinal]
            elif time.monotonic() >= pod.kill_at:
                pod.proc.kill()

    def _restart_exited(self, template: dict[str, Any], revision: str) -> None:
        """restartPolicy Always: a server that exited is recorded (exit code, and the end
        of its log as the message under FallbackToLogsOnError) and started again after a
        back-off that doubles each time, as the kubelet's CrashLoopBackOff does. The
        container comes back in the same pod: same address, same volume."""
        container = template["spec"]["containers"][0]
        now = time.monotonic()
        for ordinal, pod in list(self.pods.items()):
            code = pod.proc.poll()
            if pod.init_step is not None:
                continue  # _advance_inits
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
                # The init containers ran once for the pod: a restarted container
                # does not run them again.
                inits = len(template["spec"].get("initContainers") or [])
                new = self._start(ordinal, template, revision, port=pod.port, step=inits)
                if new is not None:
                    new.restarts, new.last = pod.restarts, pod.last
                    self.pods[ordinal] = new

    def _advance_inits(self) -> None:
        """A pod's init containers run one at a time, in order, each to completion, and
        the server only after the last: one that fails is run again after the doubling
        back-off (Init:CrashLoopBackOff meanwhile) and the server does not start."""
        now = time.monotonic()
        for ordinal, pod in list(self.pods.items()):
            code = pod.proc.poll()
            if pod.init_step is None or code is None:
                continue
            template = self._templates[pod.revision]
            step = pod.init_step
            if code != 0 and not pod.back_off_until:
                with open(pod.log_path, "rb") as f:
                    f.seek(pod.log_start)
                    message = termination_message(f.read())
                pod.init_last = {"exitCode": code, "reason": "Error", "message": message}
                pod.init_restarts += 1
                delay = self.restart_delay * 2 ** min(pod.init_restarts - 1, 5)
                pod.back_off_until = now + delay
                continue
            if code != 0 and now < pod.back_off_until:
                continue
            after = self._start(
                ordinal, template, pod.revision, port=pod.port, step=step + (code == 0)
            )
            if after is not None:
                after.init_restarts, after.init_last = pod.init_restarts, pod.init_last
                self.pods[ordinal] = after

    def _publish(
        self,
        sts: dict[str, Any] | None,
        pods: dict[int, Pod],
        conditions: dict[tuple[str, str | None], list[dict[str, Any]]] | None = None,
    ) -> None:
        """The pods as Pod objects in the API, their status as the kubelet reports it:
        Ready only once the container is ready and every readiness gate's condition,
        which someone else sets, is True. Written by a strategic merge patch that names
        only the kubelet's conditions, so the others' stay as they were set."""
        for ordinal in [o for o in self._published if o not in pods]:
            self.cluster.delete("Pod", self.namespace, f"{self.name}-{ordinal}")
            del self._published[ordinal]
            self._uids.pop(ordinal, None)
        if sts is None:
            return
        container = sts["spec"]["template"]["spec"]["containers"][0]
        for ordinal, pod in sorted(pods.items()):
            name = f"{self.name}-{ordinal}"
            waiting = None
            if pod.back_off_until:
                why = f"back-off restarting failed container={container['name']} pod={name}"
                waiting = ("CrashLoopBackOff", why)
            seen = []  # a pod about to be made has no conditions yet
            if ordinal in self._published:
                seen = (conditions or {}).get((name, self._uids.get(ordinal)), [])
            status = pod_status(
                container,
                ready=pod.ready,
                restarts=pod.restarts,
                waiting=waiting,
                last=pod.last,
                gates=pod.gates,
                conditions=seen,
            )
            inits = sts["spec"]["template"]["spec"].get("initContainers") or []
            if inits:
                status.update(
                    init_status(
                        container,
                        inits,
                        pod.init_step,
                        pod.init_restarts,
                        pod.init_last,
                        pod.init_step is not None and bool(pod.back_off_until),
                    )
                )
            if self._published.get(ordinal) == status:
                continue
            if ordinal not in self._published:
                self.cluster.delete("Pod", self.namespace, name)  # a replaced pod
                made = pod_object(sts, ordinal, pod.revision, self._templates.get(pod.revision))
                created = self.cluster.create(made)
                created.raise_for_status()
                self._uids[ordinal] = created.json()["metadata"]["uid"]
            patch = {"status": replacing_states(status)}
            self.cluster.patch(
                "Pod", self.namespace, name, patch, status=True, strategic=True
            ).raise_for_status()
            self._published[ordinal] = status

    def _volume(self, ordinal: int) -> Path | None:
        """The directory of the volume bound to the pod's claim, or None while the claim
        is not bound (or is being deleted): the pod waits for it, as a real one waits
        Pending. The claim's own volume: a claim deleted and made again is a new, empty
        one (``pod_objects.volume_dir``)."""
        sts = self.cluster.get("StatefulSet", self.namespace, self.name)
        claim = claim_name(sts, ordinal) if sts is not None else None
        if claim is None:
            path = self.root / f"data-{self.name}-{ordinal}"
            path.mkdir(parents=True, exist_ok=True)
            return path
        pvc = self.cluster.get("PersistentVolumeClaim", self.namespace, claim)
        if (
            pvc is None
            or pvc["metadata"].get("deletionTimestamp")
            or (pvc.get("status") or {}).get("phase") != "Bound"
        ):
            return None
        return volume_dir(self.root, pvc)

    def _start(
        self,
        ordinal: int,
        template: dict[str, Any],
        revision: str,
        port: int | None = None,
        step: int = 0,
    ) -> Pod | None:
        """The pod's first container not yet run (``step``: its index in the init
        containers, then the server), or None while it cannot start (a Secret it mounts
        or its env names is missing: ``waiting`` says why). ``port``: a container
        restarted in its pod keeps the pod's address."""
        name = f"{self.name}-{ordinal}"
        data_dir = self._volume(ordinal)
        if data_dir is None:
            return None
        pod_root = self.root / "pods" / name
        mounts = secret_volumes(self.cluster, self.namespace, template, pod_root)
        if mounts is None:
            return None
        # The pod's metadata as the API holds it (a container restarted in its pod), or as
        # the controller is about to make it (a new pod).
        live = self.cluster.get("Pod", self.namespace, name)
        meta = (live or {}).get("metadata") or {
            "name": name,
            "namespace": self.namespace,
            "labels": template["metadata"].get("labels") or {},
            "annotations": template["metadata"].get("annotations") or {},
        }
        downward, downward_files = downward_volumes(template, meta, pod_root)
        mounts.update(downward)
        projected = projected_volumes(self.cluster, self.namespace, template, meta, pod_root)
        if projected is None:
            return None  # a ConfigMap or Secret it projects is missing (ContainerCreating)
        mounts.update(projected[0])
        downward_files += projected[1]
        inits = template["spec"].get("initContainers") or []
        initializing = step < len(inits)
        container = inits[step] if initializing else template["spec"]["containers"][0]
        try:
            env = container_env(self.cluster, self.namespace, container, name)
        except ContainerConfigError as exc:
            self.waiting[name] = f"CreateContainerConfigError: {exc}"
            return None
        self.waiting.pop(name, None)
        port = port or free_port()
        if not initializing:
            env.update(DS_HOST="127.0.0.1", DS_PORT=str(port))
        readiness = container.get("readinessProbe") or {}
        scheme = str((readiness.get("httpGet") or {}).get("scheme", "HTTP")).lower()
        if env.get("DS_REPLICATION_LEASE"):
            # In a cluster the server finds the API server from its service account and
            # peers reach it through the headless Service; here both are on 127.0.0.1.
            url = urlsplit(env.get("DS_REPLICA_URL") or "")
            host = url.hostname if self.pod_hostnames and url.hostname else "127.0.0.1"
            env.update(DS_KUBE_API=self.cluster.url, DS_REPLICA_URL=f"{scheme}://{host}:{port}")
        log_path = self.root / (
            f"{name}-{container['name']}.log" if initializing else f"{name}.log"
        )
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
        log_start = log.tell()
        launch = ContainerLaunch(name, container, template["spec"], env, data_dir, mounts, log)
        proc = self.runtime.start(launch)
        log.close()  # the child holds its own descriptor
        if not initializing:
            self.history.append((time.monotonic(), "start", ordinal, revision))
        self._ran[ordinal] = revision
        return Pod(
            ordinal,
            revision,
            data_dir,
            port,
            proc,
            log_path,
            (readiness.get("httpGet") or {}).get("path", "/readyz"),
            log_start=log_start,
            grace=float(template["spec"].get("terminationGracePeriodSeconds", 30)),
            failure_threshold=int(readiness.get("failureThreshold", 3)),
            probe_period=float(readiness.get("periodSeconds", 10)),
            probe_timeout=float(readiness.get("timeoutSeconds", 1)),
            scheme=scheme,
            gates=readiness_gates(template["spec"]),
            gates_met=not readiness_gates(template["spec"]),
            downward=downward_files,
            init_step=step if initializing else None,
        )
