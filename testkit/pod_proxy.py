"""The API server's pod proxy (``/api/v1/namespaces/NS/pods/[SCHEME:]NAME[:PORT]/proxy/PATH``)
for the emulated API server, as kube-apiserver serves it.

kube-apiserver finds the pod (404 if there is none), takes the port named in the URL or
else the first port of the pod's first container that has one, and forwards the
request to the pod's IP on that port, answering what the pod answered; a pod nothing
listens for is ``503 ServiceUnavailable`` ("error trying to reach service"). RBAC: the
verb of the HTTP method on ``pods/proxy``.

Pods here are processes on 127.0.0.1 with ports of their own, not IPs: the test says
where each pod listens (``ApiServer.pod_network``: namespace, pod, port -> an origin, or
None while nothing runs for it), standing in for the pod network; the kubelet stand-in's
``url_of`` is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp.web
import httpx
import kmock
from kmock._internal import rendering

# namespace, pod, port -> where the pod listens (an origin), or None (nothing runs for it)
PodNetwork = Callable[[str, str, int], "str | None"]

# RBAC's verb for each HTTP method on a connect subresource (kube-apiserver's requestinfo).
VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}


def is_pod_proxy(request: rendering.Request) -> bool:
    subresource = request.subresource or ""
    return (
        request.resource is not None
        and request.resource.group == ""
        and request.resource.plural == "pods"
        and request.name is not None
        and (subresource == "proxy" or subresource.startswith("proxy/"))
    )


def verb(request: rendering.Request) -> str:
    method = str(getattr(request.method, "value", request.method)).upper()
    return VERBS.get(method, "delete" if method == "DELETE" else method.lower())


def split_name(raw: str) -> tuple[str, str, str]:
    """``[scheme:]name[:port]`` -> (scheme or "http", name, port or "")."""
    parts = raw.split(":")
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if len(parts) == 2 and parts[0] in ("http", "https"):
        return parts[0], parts[1], ""
    if len(parts) == 2:
        return "http", parts[0], parts[1]
    return "http", raw, ""


def first_port(pod: dict[str, Any]) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("containerPort"):
                return int(port["containerPort"])
    return None


async def serve(
    request: rendering.Request, pod: dict[str, Any] | None, network: PodNetwork | None
) -> aiohttp.web.Response:
    """Forward ``request`` to the pod (``pod``: the stored Pod, or None)."""
    namespace = request.namespace or ""
    scheme, name, port_name = split_name(request.name or "")
    if pod is None:
        raise kmock.KubernetesError(404, "NotFound", f'pods "{name}" not found')
    port = int(port_name) if port_name.isdigit() else first_port(pod)
    origin = network(namespace, name, port) if network is not None and port else None
    if scheme == "https" and origin is not None:
        origin = "https://" + origin.split("://", 1)[-1]
    path = (request.subresource or "").removeprefix("proxy")
    query = request.url.query_string
    where = f"{origin}{path or '/'}" + (f"?{query}" if query else "")
    if origin is None:
        raise kmock.KubernetesError(
            503,
            "ServiceUnavailable",
            f"error trying to reach service: dial tcp {name}:{port}: connect: connection refused",
        )
    method = str(getattr(request.method, "value", request.method)).upper()
    try:
        async with httpx.AsyncClient(verify=False, timeout=10) as http:
            answer = await http.request(method, where, content=request.body or None)
    except httpx.HTTPError as exc:
        raise kmock.KubernetesError(
            503, "ServiceUnavailable", f"error trying to reach service: {exc}"
        ) from None
    return aiohttp.web.Response(
        status=answer.status_code,
        body=answer.content,
        content_type=(answer.headers.get("content-type") or "text/plain").split(";")[0],
    )
