"""The kubelet stand-in's ``projected`` volumes: several sources in one directory.

As the kubelet writes them: a ``downwardAPI`` source's files as a downwardAPI volume's
(rewritten when the pod's metadata changes, ``pod_objects.refresh_downward``); a
``configMap`` or ``secret`` source's keys (its ``items``, or every key) as the object
holds them when the pod starts. A missing one keeps the pod from starting
(ContainerCreating) unless the source is ``optional``, when its files are simply not
there.

Not modelled: a real kubelet also rewrites a ConfigMap's or Secret's files some time after
the object changes (its sync period, about a minute); here they keep what the object held
at the pod's start, the slowest a kubelet may be. ``serviceAccountToken`` and
``clusterTrustBundle`` sources are refused (no test mounts them).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from testkit.cluster import Cluster
from testkit.pod_objects import refresh_downward

Files = list[tuple[Path, str]]  # (local file, fieldPath) of the downward API sources


def _object_files(
    cluster: Cluster, namespace: str, kind: str, source: dict[str, Any]
) -> dict[str, bytes] | None:
    """The files of a configMap or secret source (path -> content); None: it is missing
    and not optional."""
    obj = cluster.get(kind, namespace, source["name"])
    if obj is None:
        return {} if source.get("optional") else None
    if kind == "Secret":
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    else:
        data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    out = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            return None  # the kubelet: "couldn't find key"
        out[item["path"]] = data[item["key"]]
    return out


def projected_volume(
    cluster: Cluster,
    namespace: str,
    source: dict[str, Any],
    meta: dict[str, Any],
    local: Path,
) -> Files | None:
    """Write one projected volume under ``local`` for a pod with metadata ``meta``; its
    downward API files, or None while an object it needs is missing."""
    files: Files = []
    written: dict[str, bytes] = {}
    for part in source.get("sources") or []:
        if "downwardAPI" in part:
            for item in part["downwardAPI"].get("items") or []:
                files.append((local / item["path"], item["fieldRef"]["fieldPath"]))
        elif "configMap" in part or "secret" in part:
            kind = "ConfigMap" if "configMap" in part else "Secret"
            got = _object_files(
                cluster, namespace, kind, part["configMap" if kind == "ConfigMap" else "secret"]
            )
            if got is None:
                return None
            written.update(got)
        else:
            raise ValueError(f"the stand-in does not project {sorted(part)}")
    local.mkdir(parents=True, exist_ok=True)
    for path, content in written.items():
        tmp = local / f".{path}.tmp"
        tmp.write_bytes(content)
        tmp.replace(local / path)
    refresh_downward(files, meta)
    return files


def projected_volumes(
    cluster: Cluster, namespace: str, template: dict[str, Any], meta: dict[str, Any], root: Path
) -> tuple[dict[str, Path], Files] | None:
    """The projected volumes the server container mounts, written under ``root``:
    ``({mount path: local directory}, downward API files)``, or None while one cannot be
    made (the pod stays in ContainerCreating)."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes") or []}
    mounted: dict[str, Path] = {}
    files: Files = []
    for mount in template["spec"]["containers"][0].get("volumeMounts") or []:
        source = (volumes.get(mount["name"]) or {}).get("projected")
        if source is None:
            continue
        local = root / mount["name"]
        made = projected_volume(cluster, namespace, source, meta, local)
        if made is None:
            return None
        files += made
        mounted[mount["mountPath"].rstrip("/")] = local
    return mounted, files
