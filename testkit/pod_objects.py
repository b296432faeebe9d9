"""The API objects a StatefulSet controller and a kubelet write, built from a StatefulSet:
its claims, its pods and their statuses, its own status, a container's environment and
the Secrets mounted into it. Pure functions over dicts (and one call that creates the
claims), shared by the kubelet stand-in (``testkit.kubelet``, real processes) and the
kopf tests that play the controller by hand."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from testkit.cluster import Cluster
from testkit.downward_api import resource_field_value
from testkit.pod_secrets import ContainerConfigError, secret_key_value


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


def claim_name(sts: dict[str, Any], ordinal: int) -> str | None:
    """The PVC that holds ``ordinal``'s data volume (the first claim template's), or None
    for a StatefulSet without claim templates."""
    templates = sts["spec"].get("volumeClaimTemplates") or []
    if not templates:
        return None
    return f"{templates[0]['metadata']['name']}-{sts['metadata']['name']}-{ordinal}"


def volume_dir(root: Path, pvc: dict[str, Any]) -> Path:
    """The directory that stands for the volume bound to ``pvc``: ``root/<claim name>``.

    A claim is bound to one volume for its whole life; a claim deleted and made again
    (same name, a new uid) gets a new, empty volume, as dynamic provisioning gives it
    (the old PersistentVolume goes with its claim, reclaim policy Delete). So the
    directory records the uid of the claim it belongs to (``<claim name>.uid`` next to
    it); a directory that belonged to another claim is moved aside to
    ``root/released/<claim name>-<old uid>`` (kept for reading after a failure, never
    used again) and an empty one takes its place. A directory without a record (made
    before records were kept, or by a test that filled it by hand) is the claim's.
    """
    name, uid = pvc["metadata"]["name"], pvc["metadata"]["uid"]
    path, record = root / name, root / f"{name}.uid"
    owner = record.read_text().strip() if record.exists() else None
    if owner is not None and owner != uid and path.exists():
        released = root / "released"
        released.mkdir(parents=True, exist_ok=True)
        path.rename(released / f"{name}-{owner}")
    if owner != uid:
        path.mkdir(parents=True, exist_ok=True)
        record.write_text(uid + "\n")
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    ``env`` in order, ``metadata.name`` and the container's CPU (``resourceFieldRef``) from
    the downward API, a ``secretKeyRef``'s key and ``$(VAR)`` expanded from the variables
    defined before it (as the kubelet does).
    A Secret or key missing (and not ``optional``) raises ``ContainerConfigError``."""
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
        elif ref := (var.get("valueFrom") or {}).get("resourceFieldRef"):
            env[var["name"]] = resource_field_value(container, ref)
        elif ref := (var.get("valueFrom") or {}).get("secretKeyRef"):
            value = secret_key_value(cluster, namespace, ref)
            if value is not None:
                env[var["name"]] = value
            elif not ref.get("optional"):
                raise ContainerConfigError(
                    f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}"
                )
    return env


# The label the StatefulSet controller puts on each pod: the revision it was made from.
REVISION_LABEL = "controller-revision-hash"


def template_revision(sts: dict[str, Any], template: dict[str, Any] | None = None) -> str:
    """The revision name of a pod template, as the StatefulSet controller names its
    ControllerRevisions (``<statefulset>-<hash>``)."""
    template = template if template is not None else sts["spec"]["template"]
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
    return f"{sts['metadata']['name']}-{digest}"


def pod_object(
    sts: dict[str, Any],
    ordinal: int,
    revision: str | None = None,
    template: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod the StatefulSet controller makes for ``ordinal`` (without its status), from
    ``template`` (default: the StatefulSet's), labelled with its ``revision`` if given."""
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    template = template if template is not None else sts["spec"]["template"]
    labels = dict(template["metadata"].get("labels") or {})
    if revision is not None:
        labels[REVISION_LABEL] = revision
    meta: dict[str, Any] = {
        "name": f"{name}-{ordinal}",
        "namespace": namespace,
        "labels": labels,
        # The StatefulSet controls it: the disruption controller finds the expected
        # number of pods through this reference (a budget's maxUnavailable).
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": name,
                "uid": sts["metadata"].get("uid", ""),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template["metadata"].get("annotations"):
        meta["annotations"] = dict(template["metadata"]["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def readiness_gates(spec: dict[str, Any]) -> list[str]:
    """The condition types a pod's ``readinessGates`` name, in order."""
    return [g["conditionType"] for g in spec.get("readinessGates") or []]


def gates_not_ready(gates: list[str], conditions: list[dict[str, Any]]) -> str | None:
    """Why the readiness gates keep a pod not Ready, in the kubelet's words, or None when
    every gate's condition is True (the kubelet's GeneratePodReadyCondition)."""
    have = {c.get("type"): c.get("status") for c in conditions}
    for gate in gates:
        if gate not in have:
            return f'corresponding condition of pod readiness gate "{gate}" does not exist.'
        if have[gate] != "True":
            return f'the status of pod readiness gate "{gate}" is not "True", but {have[gate]}'
    return None


def ready_conditions(
    ready: bool, gates: list[str], conditions: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The conditions the kubelet owns, ContainersReady and Ready: a pod is Ready only
    when its containers are and every readiness gate's condition (set by someone else,
    in ``conditions``: the pod's as the API holds them) is True."""
    containers: dict[str, Any] = {"type": "ContainersReady", "status": str(ready)}
    pod: dict[str, Any] = {"type": "Ready", "status": str(ready)}
    if not ready:
        containers["reason"] = pod["reason"] = "ContainersNotReady"
    elif (why := gates_not_ready(gates, conditions)) is not None:
        pod.update(status="False", reason="ReadinessGatesNotReady", message=why)
    return [containers, pod]


def pod_status(
    container: dict[str, Any],
    *,
    ready: bool,
    restarts: int,
    waiting: tuple[str, str] | None = None,
    last: dict[str, Any] | None = None,
    gates: list[str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod's status as the kubelet reports it for its one container: running, or
    waiting with (reason, message); ``last`` the previous run's ``terminated`` state.
    With readiness ``gates``, Ready also needs each gate's condition True in
    ``conditions`` (the pod's in the API); the status holds only the kubelet's own
    conditions, which a strategic merge patch writes beside the others'."""
    state: dict[str, Any] = {"running": {}}
    if waiting is not None:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    kubelets = [{"type": "Ready", "status": "True" if ready else "False"}]
    if gates:
        kubelets = ready_conditions(ready, gates, conditions or [])
    return {
        "phase": "Running",
        "conditions": kubelets,
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


def secret_volumes(
    cluster: Cluster, namespace: str, template: dict[str, Any], root: Path
) -> dict[str, Path] | None:
    """The Secret volumes the server container mounts, written out as the kubelet writes
    them (one file per key) under ``root``: ``{mount path: local directory}``. None while
    a Secret the pod needs does not exist yet (the pod stays in ContainerCreating)."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes") or []}
    container = template["spec"]["containers"][0]
    mounted: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        source = (volumes.get(mount["name"]) or {}).get("secret")
        if source is None:
            continue
        assert cluster.http is not None
        r = cluster.http.get(f"/api/v1/namespaces/{namespace}/secrets/{source['secretName']}")
        if r.status_code == 404:
            if source.get("optional"):
                continue
            return None
        r.raise_for_status()
        data = r.json().get("data") or {}
        wanted = source.get("items") or [{"key": k, "path": k} for k in data]
        local = root / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        for item in wanted:
            (local / item["path"]).write_bytes(base64.b64decode(data.get(item["key"], "")))
        mounted[mount["mountPath"].rstrip("/")] = local
    return mounted


def downward_text(meta: dict[str, Any], field_path: str) -> str:
    """A downward API volume's file for ``field_path`` of a pod with metadata ``meta``, as
    the kubelet writes it: a name or namespace as it is; labels and annotations one
    ``key="value"`` line each, sorted by key, the value quoted (Go's ``%q``)."""
    if field_path in ("metadata.name", "metadata.namespace"):
        return str(meta.get(field_path.split(".")[1], ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(field_path.split(".")[1]) or {}
        return "\n".join(
            f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(items.items())
        )
    raise ValueError(f"the stand-in does not give {field_path} through the downward API")


def downward_volumes(
    template: dict[str, Any], meta: dict[str, Any], root: Path
) -> tuple[dict[str, Path], list[tuple[Path, str]]]:
    """The downwardAPI volumes the server container mounts, written out under ``root`` for
    a pod with metadata ``meta``: ``({mount path: local directory}, [(file, fieldPath)])``,
    the second for ``refresh_downward`` when the pod's metadata changes."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes") or []}
    container = template["spec"]["containers"][0]
    mounted: dict[str, Path] = {}
    files: list[tuple[Path, str]] = []
    for mount in container.get("volumeMounts") or []:
        source = (volumes.get(mount["name"]) or {}).get("downwardAPI")
        if source is None:
            continue
        local = root / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        for item in source.get("items") or []:
            files.append((local / item["path"], item["fieldRef"]["fieldPath"]))
        mounted[mount["mountPath"].rstrip("/")] = local
    refresh_downward(files, meta)
    return mounted, files


def refresh_downward(files: list[tuple[Path, str]], meta: dict[str, Any]) -> bool:
    """Rewrite the downward API files whose content ``meta`` changes, each replaced whole
    (the kubelet swaps the volume's directory: a reader sees the old file or the new one,
    never half of one); whether any changed."""
    changed = False
    for path, field_path in files:
        text = downward_text(meta, field_path)
        try:
            if path.read_text() == text:
                continue
        except FileNotFoundError:
            pass
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        changed = True
    return changed


def translated(value: str, mounts: dict[str, Path]) -> str:
    """A path inside the container as the same file here (a mounted Secret's directory)."""
    for inside, local in mounts.items():
        if value == inside or value.startswith(inside + "/"):
            return str(local) + value[len(inside) :]
    return value
