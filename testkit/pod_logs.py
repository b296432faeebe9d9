"""The pods/log subresource (``GET /api/v1/namespaces/NS/pods/NAME/log``) for the emulated
API server, as kube-apiserver serves it from the kubelet.

kube-apiserver finds the pod (404 if there is none) and asks its node's kubelet for the
container's log: the current run, or with ``previous=true`` the run before the last
restart (400 when there is none, the kubelet's "previous terminated container ... not
found"). ``tailLines`` keeps the last lines; ``sinceSeconds``/``sinceTime`` keep the
lines written since then, which needs each line's time: the log book keeps it, as the
container runtime's log file does. ``follow`` answers what there is and ends, as the
kubelet does for a container that has ended; ``container`` must name one of the pod's
containers (400 otherwise). RBAC: ``get`` on ``pods/log``.

No node runs here, so the test says what each container wrote (``LogBook``), standing in
for the kubelet's log files: ``ApiServer.pod_logs``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import rendering

Line = tuple[datetime.datetime, str]


@dataclass
class LogBook:
    """Each container's output: (namespace, pod, container) -> the current run's lines
    and the previous run's (None: it has not restarted)."""

    current: dict[tuple[str, str, str], list[Line]] = field(default_factory=dict)
    previous: dict[tuple[str, str, str], list[Line]] = field(default_factory=dict)

    def write(self, namespace: str, pod: str, text: str, container: str = "server") -> None:
        now = datetime.datetime.now(datetime.UTC)
        run = self.current.setdefault((namespace, pod, container), [])
        run += [(now, line) for line in text.splitlines()]

    def restart(self, namespace: str, pod: str, container: str = "server") -> None:
        """The container ended and runs again: its output becomes the previous run's."""
        key = (namespace, pod, container)
        self.previous[key] = self.current.pop(key, [])

    def lines(self, namespace: str, pod: str, container: str, previous: bool) -> list[Line] | None:
        key = (namespace, pod, container)
        return (self.previous if previous else self.current).get(key, None if previous else [])


def is_pod_log(request: rendering.Request) -> bool:
    return (
        request.resource is not None
        and request.resource.group == ""
        and request.resource.plural == "pods"
        and request.name is not None
        and request.subresource == "log"
    )


def _bad(message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(400, "BadRequest", message)


def _since(params: Any) -> datetime.datetime | None:
    if params.get("sinceSeconds"):
        seconds = int(params["sinceSeconds"])
        if seconds <= 0:
            raise _bad("sinceSeconds must be greater than 0")
        return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    if params.get("sinceTime"):
        return datetime.datetime.fromisoformat(str(params["sinceTime"]).replace("Z", "+00:00"))
    return None


async def serve(
    request: rendering.Request, pod: dict[str, Any] | None, book: LogBook | None
) -> aiohttp.web.Response:
    """The log of ``request``'s pod (``pod``: the stored Pod, or None) as plain text."""
    name = request.name or ""
    if pod is None:
        raise kmock.KubernetesError(404, "NotFound", f'pods "{name}" not found')
    params = request.params
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    container = str(params.get("container") or (names[0] if names else ""))
    if container not in names:
        raise _bad(f"container {container} is not valid for pod {name}")
    previous = str(params.get("previous") or "").lower() == "true"
    found = (book or LogBook()).lines(request.namespace or "", name, container, previous)
    if found is None:
        raise _bad(f'previous terminated container "{container}" in pod "{name}" not found')
    since = _since(params)
    lines = [(t, text) for t, text in found if since is None or t >= since]
    if params.get("tailLines"):
        lines = lines[len(lines) - int(params["tailLines"]) :] if int(params["tailLines"]) else []
    stamped = str(params.get("timestamps") or "").lower() == "true"
    body = "".join(
        (f"{t.isoformat().replace('+00:00', 'Z')} " if stamped else "") + text + "\n"
        for t, text in lines
    )
    return aiohttp.web.Response(text=body, content_type="text/plain")
