"""``kubectl dstream report``: a support bundle, one zip file a user can attach to an
issue, as ``kubectl cnpg report cluster`` makes one.

What it holds (``manifest.json`` lists every file, and what could not be read, why):
the DurableStream with its status and its Events; the objects it owns (StatefulSet,
Services, PodDisruptionBudget, ConfigMaps) and its Lease; each pod's description (the
Pod object and its Events, what ``kubectl describe`` shows) and its server's log, the
current run and the one before the last restart; each server's own ``GET
/replication`` and ``GET /_archive/status``, through the API server's pod proxy as
``status --live`` asks; and the operator's version (its Deployment, found by the chart's
labels) and the plugin's.

Secrets are never read: the bundle names the Secrets the pods use (from the pod
template) and nothing more. ``managedFields`` are left out (noise). A part the user may
not read (403) or that is not there is noted in the manifest, and the bundle made of
the rest.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import yaml  # type: ignore[import-untyped]  # no types-PyYAML in the environment
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import KIND
from stream_operator.plugin import PluginError
from stream_operator.plugin.commands import (
    TIMEOUT,
    _events,
    _json,
    _pods,
    read_stream,
)
from stream_operator.plugin.logs import read_log
from stream_operator.specs.certificates import serves_tls
from stream_operator.specs.render import CONTAINER_PORT, lease_name

# The chart's labels on the operator's Deployment (charts/durable-streams, ds.labels).
OPERATOR_SELECTOR = "app.kubernetes.io/name=durable-streams-operator"
# Each server's own view, through the pod proxy: path in the server -> file in the bundle.
SERVER_VIEWS = {"replication": "replication.json", "_archive/status": "archive-status.json"}
# (what, how to list it in a namespace) for the objects a DurableStream owns.
OWNED: list[tuple[str, Callable[[client.ApiClient], Callable[..., Any]]]] = [
    ("statefulset", lambda a: client.AppsV1Api(a).list_namespaced_stateful_set),
    ("service", lambda a: client.CoreV1Api(a).list_namespaced_service),
    ("poddisruptionbudget", lambda a: client.PolicyV1Api(a).list_namespaced_pod_disruption_budget),
    ("configmap", lambda a: client.CoreV1Api(a).list_namespaced_config_map),
]


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def _yaml(obj: Any) -> str:
    return str(yaml.safe_dump(obj, sort_keys=False))


def secret_names(sts: dict[str, Any] | None) -> list[str]:
    """The Secrets a pod template uses (volumes, env, envFrom, image pull): names only."""
    if sts is None:
        return []
    pod = ((sts.get("spec") or {}).get("template") or {}).get("spec") or {}
    names = {ref.get("name") for ref in pod.get("imagePullSecrets") or []}
    for volume in pod.get("volumes") or []:
        names.add((volume.get("secret") or {}).get("secretName"))
        for source in (volume.get("projected") or {}).get("sources") or []:
            names.add((source.get("secret") or {}).get("name"))
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for env in container.get("env") or []:
            names.add(((env.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name"))
        for source in container.get("envFrom") or []:
            names.add((source.get("secretRef") or {}).get("name"))
    return sorted(n for n in names if n)


class Bundle:
    """The files of the bundle, and what could not be read (path -> why)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.errors: dict[str, str] = {}

    def add(self, path: str, read: Callable[[], str]) -> None:
        try:
            self.files[path] = read()
        except ApiException as exc:
            self.errors[path] = f"{exc.status} {exc.reason}"
        except PluginError as exc:
            self.errors[path] = str(exc)


def _owned(api: client.ApiClient, namespace: str, uid: str) -> Iterable[tuple[str, dict[str, Any]]]:
    for kind, lister in OWNED:
        found = _json(api, lister(api)(namespace, _request_timeout=TIMEOUT))
        for obj in found.get("items") or []:
            refs = (obj.get("metadata") or {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                yield kind, obj


def _server_view(api: client.ApiClient, namespace: str, scheme: str, pod: str, path: str) -> str:
    raw: Any = client.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path(
        f"{scheme}{pod}:{CONTAINER_PORT}",
        namespace,
        path,
        _request_timeout=TIMEOUT,
        _preload_content=False,
    )
    body = raw.data or b""
    try:
        return json.dumps(json.loads(body), indent=2) + "\n"
    except ValueError:
        return body.decode("utf-8", "replace")


def _operator(api: client.ApiClient) -> str:
    found = _json(
        api,
        client.AppsV1Api(api).list_deployment_for_all_namespaces(
            label_selector=OPERATOR_SELECTOR, _request_timeout=TIMEOUT
        ),
    )
    return _yaml(
        [
            {
                "namespace": d["metadata"].get("namespace"),
                "name": d["metadata"].get("name"),
                "version": (d["metadata"].get("labels") or {}).get("app.kubernetes.io/version"),
                "images": [
                    c.get("image")
                    for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
                    or []
                ],
                "readyReplicas": (d.get("status") or {}).get("readyReplicas"),
            }
            for d in found.get("items") or []
        ]
    )


def collect(api: client.ApiClient, namespace: str, name: str) -> tuple[Bundle, dict[str, Any]]:
    """Every part of the bundle, and the manifest's summary."""
    ds = read_stream(api, namespace, name)
    uid = ds["metadata"].get("uid") or ""
    bundle = Bundle()
    bundle.add("durablestream.yaml", lambda: _yaml(_clean(ds)))
    bundle.add("events.yaml", lambda: _yaml(_events(api, namespace, name)))
    sts: dict[str, Any] | None = None
    try:
        for kind, obj in _owned(api, namespace, uid):
            sts = obj if kind == "statefulset" else sts
            bundle.files[f"objects/{kind}-{obj['metadata']['name']}.yaml"] = _yaml(_clean(obj))
    except ApiException as exc:
        bundle.errors["objects/"] = f"{exc.status} {exc.reason}"
    lease = lease_name(name)
    bundle.add(
        f"objects/lease-{lease}.yaml",
        lambda: _yaml(
            _clean(
                _json(
                    api,
                    client.CoordinationV1Api(api).read_namespaced_lease(
                        lease, namespace, _request_timeout=TIMEOUT
                    ),
                )
            )
        ),
    )
    scheme = "https:" if serves_tls(ds) else ""
    pods = _pods(api, namespace, name)
    for pod in pods:
        one = pod["metadata"]["name"]
        base = f"pods/{one}"
        bundle.files[f"{base}/pod.yaml"] = _yaml(_clean(pod))
        bundle.add(f"{base}/events.yaml", functools.partial(_pod_events, api, namespace, one))
        for previous, file in ((False, "server.log"), (True, "server-previous.log")):
            bundle.add(f"{base}/{file}", functools.partial(_log, api, namespace, one, previous))
        for path, file in SERVER_VIEWS.items():
            bundle.add(
                f"{base}/{file}", functools.partial(_server_view, api, namespace, scheme, one, path)
            )
    bundle.add("operator.yaml", lambda: _operator(api))
    summary = {
        "kind": "DurableStreamSupportBundle",
        "durableStream": name,
        "namespace": namespace,
        "uid": uid,
        "phase": (ds.get("status") or {}).get("phase"),
        "pods": [p["metadata"]["name"] for p in pods],
        "secrets": {"names": secret_names(sts), "note": "names only: no Secret is read"},
        "plugin": {"version": _version()},
    }
    return bundle, summary


def _log(api: client.ApiClient, namespace: str, pod: str, previous: bool) -> str:
    return "".join(line + "\n" for line in read_log(api, namespace, pod, previous=previous))


def _pod_events(api: client.ApiClient, namespace: str, pod: str) -> str:
    found = client.CoreV1Api(api).list_namespaced_event(
        namespace,
        field_selector=f"involvedObject.name={pod},involvedObject.kind=Pod",
        _request_timeout=TIMEOUT,
    )
    return _yaml(
        [
            e
            for e in _json(api, found).get("items") or []
            if (e.get("involvedObject") or {}).get("name") == pod
        ]
    )


def _version() -> str:
    try:
        return importlib.metadata.version("durable-streams-py")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def destination(output: str | None, name: str, now: datetime.datetime) -> Path:
    """``-o FILE.zip``, or a directory (made if missing) to put the zip in; default: here."""
    default = f"{name}-report-{now.strftime('%Y%m%dT%H%M%SZ')}.zip"
    if output is None:
        return Path(default)
    path = Path(output)
    if path.suffix == ".zip":
        return path
    if path.exists() and not path.is_dir():
        raise PluginError(f"{output}: not a directory, and not a .zip file name")
    path.mkdir(parents=True, exist_ok=True)
    return path / default


def report(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    output: str | None,
    out: TextIO,
    now: datetime.datetime | None = None,
) -> int:
    when = now or datetime.datetime.now(datetime.UTC)
    target = destination(output, name, when)
    bundle, summary = collect(api, namespace, name)
    manifest = {
        **summary,
        "createdAt": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": sorted(bundle.files),
        "unread": bundle.errors,
    }
    top = f"{name}-report"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{top}/manifest.json", json.dumps(manifest, indent=2) + "\n")
        for path, text in sorted(bundle.files.items()):
            archive.writestr(f"{top}/{path}", text)
    unread = f", {len(bundle.errors)} part(s) unread (see manifest.json)" if bundle.errors else ""
    out.write(f"{KIND} {namespace}/{name}: support bundle written to {target}{unread}\n")
    return 0
