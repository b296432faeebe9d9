"""Each subcommand's reads and writes through the API server.

Reads: the DurableStream, its pods, its Events, its Lease, and with ``--live`` each
pod's ``GET /replication`` through the API server's pod proxy. Writes: annotations on
the DurableStream, nothing else; the operator carries them out (docs/kubernetes.md).
A read-modify-write (the fenced list) names the resourceVersion it read, so a
concurrent change is a 409 and the edit is made again on the new value.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any, TextIO, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP, KIND, PLURAL, VERSION
from stream_operator.api.spec import spec_of
from stream_operator.plugin import (
    FENCED,
    HIBERNATION,
    SWITCHOVER_TO,
    PluginError,
    fencing,
    report,
)
from stream_operator.specs.certificates import serves_tls
from stream_operator.specs.render import CONTAINER_PORT, selector

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT = 15  # seconds, each API request
# The Events the operator records for a switchover asked for with SWITCHOVER_TO
# (stream_operator.controllers.replica_set): made, failed, or refused without any call.
SWITCHOVER_EVENTS = ("Switchover", "SwitchoverFailed", "SwitchoverRequest")


def _failed(exc: ApiException, what: str) -> PluginError:
    reason = exc.reason or ""
    with contextlib.suppress(ValueError, AttributeError):  # a body that is no Status
        reason = json.loads(exc.body or "{}").get("message") or reason
    if exc.status == 403:
        return PluginError(f"forbidden to {what}: {reason} (docs/kubernetes.md lists the rights)")
    return PluginError(f"could not {what}: {exc.status} {reason}")


def _json(api: client.ApiClient, obj: Any) -> Any:
    return api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


def read_stream(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    try:
        found = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=TIMEOUT
        )
        return cast("dict[str, Any]", found)  # a custom object: JSON as it came
    except ApiException as exc:
        if exc.status == 404:
            raise PluginError(
                f'DurableStream "{name}" not found in namespace "{namespace}"'
            ) from None
        raise _failed(exc, f"read DurableStream {name}") from None


def members(ds: dict[str, Any]) -> list[str]:
    """The pods a DurableStream's StatefulSet has (or makes): ``<name>-0`` ...``-<n-1>``."""
    name = ds["metadata"]["name"]
    return [f"{name}-{i}" for i in range(spec_of(ds).replicas)]


def replica_set(ds: dict[str, Any], what: str) -> None:
    """Refuse ``what`` for a DurableStream of one server: there is no standby."""
    want = spec_of(ds).replicas
    if want < 2:
        name = ds["metadata"]["name"]
        raise PluginError(f"{name} is not a replica set (replicas: {want}): {what} needs one")


def _pods(api: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    chosen = ",".join(f"{k}={v}" for k, v in selector(name).items())
    try:
        found = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=chosen, _request_timeout=TIMEOUT
        )
    except ApiException as exc:
        raise _failed(exc, f"list the pods of {name}") from None
    # The StatefulSet's pods only: <name>-<ordinal> (a Spark job's pods carry the labels too).
    return [
        p
        for p in _json(api, found).get("items") or []
        if str(p["metadata"]["name"]).removeprefix(f"{name}-").isdigit()
    ]


def _events(api: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    try:
        found = client.CoreV1Api(api).list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind={KIND}",
            _request_timeout=TIMEOUT,
        )
    except ApiException as exc:
        raise _failed(exc, f"list the Events of {name}") from None
    return [
        e
        for e in _json(api, found).get("items") or []
        if (e.get("involvedObject") or {}).get("name") == name
        and (e.get("involvedObject") or {}).get("kind") == KIND
    ]


def _lease(api: client.ApiClient, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]:
    """The Lease and, when it could not be read, why (the ``view`` role has no leases)."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            f"{name}-leader", namespace, _request_timeout=TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:
            return None, ""
        return None, f"{exc.status} {exc.reason}"
    return _json(api, lease), ""


def _live(
    api: client.ApiClient, namespace: str, ds: dict[str, Any], pods: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each running pod's ``GET /replication``, through the API server's pod proxy
    (``pods/proxy``): ``https:`` when the servers serve TLS."""
    scheme = "https:" if serves_tls(ds) else ""
    answers: dict[str, dict[str, Any]] = {}
    core = client.CoreV1Api(api)
    for pod in pods:
        name = pod["metadata"]["name"]
        try:
            # Unparsed (_preload_content=False): the urllib3 response, not the typed str.
            raw: Any = core.connect_get_namespaced_pod_proxy_with_path(
                f"{scheme}{name}:{CONTAINER_PORT}",
                namespace,
                "replication",
                _request_timeout=TIMEOUT,
                _preload_content=False,
            )
            body = json.loads(raw.data or b"{}")
            answers[name] = body if isinstance(body, dict) else {"error": "not a JSON object"}
        except ApiException as exc:
            answers[name] = {"error": f"{exc.status} {exc.reason}"}
        except ValueError:
            answers[name] = {"error": "the answer is not JSON"}
    return answers


def status(
    api: client.ApiClient, namespace: str, name: str, *, live: bool, as_json: bool, out: TextIO
) -> int:
    ds = read_stream(api, namespace, name)
    replicated = spec_of(ds).replicated
    pods = _pods(api, namespace, name)
    lease, why = _lease(api, namespace, name) if replicated else (None, "")
    answers = _live(api, namespace, ds, pods) if live else None
    made = report.build(
        ds, pods, _events(api, namespace, name), lease, lease_error=why, live=answers
    )
    out.write(json.dumps(made, indent=2) + "\n" if as_json else report.render(made))
    return 0


def _annotate(
    api: client.ApiClient,
    namespace: str,
    name: str,
    notes: dict[str, str | None],
    resource_version: str | None = None,
) -> dict[str, Any]:
    """A merge patch of the DurableStream's annotations (None removes one)."""
    meta: dict[str, Any] = {"annotations": notes}
    if resource_version:
        meta["resourceVersion"] = resource_version
    patched = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"metadata": meta},
        _content_type=MERGE_PATCH,
        _request_timeout=TIMEOUT,
    )
    return cast("dict[str, Any]", patched)


def hibernate(api: client.ApiClient, namespace: str, name: str, on: bool, out: TextIO) -> int:
    read_stream(api, namespace, name)
    value = "on" if on else "off"
    try:
        _annotate(api, namespace, name, {HIBERNATION: value})
    except ApiException as exc:
        raise _failed(exc, f"annotate DurableStream {name}") from None
    what = (
        "the operator scales it to zero pods, keeping its volumes and Lease"
        if on
        else "the operator starts its pods again"
    )
    out.write(f"durablestream/{name} annotated {HIBERNATION}={value}: {what}\n")
    return 0


def fence(
    api: client.ApiClient,
    namespace: str,
    name: str,
    pods: list[str],
    *,
    all_pods: bool,
    on: bool,
    out: TextIO,
) -> int:
    """Add ``pods`` to the fenced list (``on``) or take them off it."""
    if not pods and not all_pods:
        raise PluginError("name the pods to " + ("fence" if on else "unfence") + ", or --all")
    for _attempt in range(5):
        ds = read_stream(api, namespace, name)
        if on:
            strangers = [p for p in pods if p not in members(ds)]
            if strangers:
                raise PluginError(
                    f"{', '.join(strangers)}: not a pod of {name} ({', '.join(members(ds))})"
                )
        notes = ds["metadata"].get("annotations") or {}
        current = fencing.fenced_list(notes.get(FENCED))
        edit = fencing.fence if on else fencing.unfence
        after = edit(current, pods, all_pods=all_pods)
        value = json.dumps(after) if after else None
        try:
            _annotate(api, namespace, name, {FENCED: value}, ds["metadata"]["resourceVersion"])
        except ApiException as exc:
            if exc.status == 409:
                continue  # changed meanwhile: edit the new list
            raise _failed(exc, f"annotate DurableStream {name}") from None
        now = ", ".join(after) if after else "none"
        out.write(f"durablestream/{name} fenced instances: {now}\n")
        return 0
    raise PluginError(f"DurableStream {name} kept changing: try again")


def _event_key(event: dict[str, Any]) -> tuple[str, Any, str]:
    return (event["metadata"].get("name") or "", event.get("count"), report.event_time(event))


def switchover(
    api: client.ApiClient,
    namespace: str,
    name: str,
    target: str,
    *,
    wait: bool,
    timeout: float,
    out: TextIO,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Annotate ``switchover-to=target``; with ``wait``, report what the operator made of
    it: the target primary in the status (0), or the Event that says why not (1)."""
    ds = read_stream(api, namespace, name)
    replica_set(ds, "a switchover")
    if target not in members(ds):
        raise PluginError(f"{target} is not a pod of {name} ({', '.join(members(ds))})")
    before = ds.get("status") or {}
    if before.get("primary") == target:
        out.write(f"{target} is the primary already (term {before.get('term')})\n")
        return 0
    seen = {_event_key(e) for e in _events(api, namespace, name)}
    try:
        _annotate(api, namespace, name, {SWITCHOVER_TO: target})
    except ApiException as exc:
        raise _failed(exc, f"annotate DurableStream {name}") from None
    out.write(f"durablestream/{name} annotated {SWITCHOVER_TO}={target}\n")
    if not wait:
        return 0
    out.flush()
    return _await_switchover(
        api, namespace, name, target, seen, timeout=timeout, out=out, poll=poll, clock=clock
    )


def _await_switchover(
    api: client.ApiClient,
    namespace: str,
    name: str,
    target: str,
    seen: set[tuple[str, Any, str]],
    *,
    timeout: float,
    out: TextIO,
    poll: float,
    clock: Callable[[], float],
) -> int:
    """Read the Events and the status until the operator answered the request or made the
    switchover, or ``timeout`` passed. ``seen``: the Events there before the request."""
    deadline = clock() + timeout
    made = ""
    while True:
        found, done = _switchover_events(api, namespace, name, seen)
        made = found or made
        if done is not None:
            out.write(f"{done}\n")
            return 0
        st = read_stream(api, namespace, name).get("status") or {}
        if st.get("primary") == target:
            if made:
                out.write(f"{made}\n")
            out.write(f"{target} is the primary now (term {st.get('term')})\n")
            return 0
        if clock() >= deadline:
            break
        time.sleep(poll)
    if made:
        out.write(f"{made}\n(the status does not show {target} as primary yet)\n")
        return 0
    raise PluginError(
        f"no outcome within {timeout:g} s; the annotation stays and the operator acts on it "
        "when no rolling update is under way (kubectl get events --field-selector "
        f"involvedObject.name={name})"
    )


def _switchover_events(
    api: client.ApiClient, namespace: str, name: str, seen: set[tuple[str, Any, str]]
) -> tuple[str, str | None]:
    """The switchover Events not ``seen`` yet (added to it): the switchover's message (""
    if none), and the message of a request the operator found done already (None if
    none). A refused request raises PluginError with the operator's reason."""
    made = ""
    for event in sorted(_events(api, namespace, name), key=report.event_time):
        if event.get("reason") not in SWITCHOVER_EVENTS or _event_key(event) in seen:
            continue
        seen.add(_event_key(event))
        message = str(event.get("message") or "")
        if event["reason"] == "Switchover":
            made = message
        elif event["reason"] == "SwitchoverRequest" and event.get("type") == "Normal":
            return made, message
        else:
            raise PluginError(f"the operator did not switch over: {message}")
    return made, None
