"""Fencing: a server whose process stays up but leaves its storage alone (CloudNativePG's
fenced instance: the instance manager runs, PostgreSQL does not).

Switched at run time from one file, ``--fence-file`` (``DS_FENCE_FILE``): a downward API
volume's file of the pod's annotations (``key="value"`` lines), fenced while it holds
``streams.pyds.dev/fenced="true"``. The operator writes that annotation on the pods a
DurableStream's ``streams.pyds.dev/fenced-instances`` names; the kubelet rewrites the file
when the pod's annotations change. A file, not a call to the API: a single server has no
service account token, and a pod needs no right to read pods.

A pod made after the fence (one deleted, or recreated by its StatefulSet) has no such
annotation until the operator's next round writes it: the same volume (a ``projected``
one) also holds the operator's list of fenced pods (``fenced-instances``, a JSON list of
pod names, ``"*"`` for all, from a ConfigMap the kubelet writes when the pod starts) and
the pod's name (``pod-name``, downward API), next to the fence file. The annotation, once
the operator has written one (``"true"`` or ``"false"``), decides; a pod without it is
fenced when the list names it. So a new pod of a fenced instance never opens its storage,
and lifting a fence (the annotation ``"false"``) does not wait for the kubelet's refresh
of the ConfigMap's file (up to a minute or so).

The mode is chosen once, when the process starts, and a change is carried out by
starting again in the same process (``exec``, as a re-copy from the primary does): the
process, its PID and the container stay, so the liveness probe passes and the kubelet
counts no restart.

- Fenced at start: no storage is opened (no recovery, no layout check, no write of any
  kind, no Lease, no peers); ``FencedApp`` answers ``/healthz`` 200, ``/readyz`` 503 and
  everything else 503 ``FENCED``.
- Fenced while serving: the server stops exactly as on SIGTERM (a primary hands the Lease
  to an in-sync standby first, live reads end, the store closes), then starts again,
  fenced.
- Unfenced: it starts again as an ordinary server: recovery, then the set's rules (a
  standby follows, and copies what it missed).

The file is looked at every ``CHECK_INTERVAL`` seconds; one that cannot be read leaves the
mode as it is (a kubelet swapping the volume's directory, a file not yet written).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

from stream_server.rotation import FileWatcher, Watched

log = logging.getLogger("stream_server.fencing")

FENCED_ANNOTATION = "streams.pyds.dev/fenced"
# Beside the fence file, in the same volume (the operator's render.py names them too).
LIST_FILE = "fenced-instances"
NAME_FILE = "pod-name"
CHECK_INTERVAL = 1.0
CODE = "FENCED"
MESSAGE = (
    f"this server is fenced ({FENCED_ANNOTATION}): it serves nothing and leaves its "
    "storage untouched until the fence is lifted"
)


def parse_annotations(text: str) -> dict[str, str]:
    """The downward API's ``metadata.annotations`` file: one ``key="value"`` line each,
    the value quoted as Go's ``%q`` quotes it (a JSON string for the values that matter
    here; a line that does not parse is skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, str):
            out[key.strip()] = value
    return out


def read_fence(path: str) -> bool | None:
    """Whether ``path`` (and the list beside it) says fenced; None when it cannot be read
    (the mode stays)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    annotations = parse_annotations(text)
    if FENCED_ANNOTATION in annotations:
        return annotations[FENCED_ANNOTATION].strip().lower() == "true"
    return listed(Path(path).parent)


def listed(directory: Path) -> bool | None:
    """Whether the operator's list in ``directory`` names this pod: not when there is no
    list (no ConfigMap: an operator before it, or a server run by hand) or no name; None
    when the list cannot be read."""
    try:
        raw = (directory / LIST_FILE).read_text(encoding="utf-8")
        pod = (directory / NAME_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        names = json.loads(raw or "[]")
    except ValueError:
        return None
    if not isinstance(names, list):
        return None
    return bool(pod) and ("*" in names or pod in names)


def fenced_at_start(path: str) -> bool:
    """The mode to start in: fenced only when the file says so (a missing file: not)."""
    return bool(path) and read_fence(path) is True


def restart_process() -> None:
    """Start again in this process, with the command line it was started with."""
    os.execv(sys.executable, sys.orig_argv)


class FenceWatch:
    """Calls ``changed`` once the file's fence differs from ``fenced`` (the mode this
    process runs in): read when the file changes, as ``rotation`` watches the TLS files
    (looked at every ``CHECK_INTERVAL`` seconds), and once at start."""

    def __init__(self, path: str, fenced: bool, changed: Callable[[], None]) -> None:
        self.path = path
        self.fenced = fenced
        self.changed = changed
        self.requested = False  # the file asked for the other mode
        near = Path(path).parent
        files = (path, str(near / LIST_FILE), str(near / NAME_FILE))
        self._files = FileWatcher(
            [Watched("fence file", files, self.check)], CHECK_INTERVAL, sighup=False
        )

    def check(self) -> None:
        now = read_fence(self.path)
        if now is None or now == self.fenced or self.requested:
            return
        self.requested = True
        log.warning(
            "%s: %s; starting again %s",
            self.path,
            "fenced" if now else "the fence is lifted",
            "fenced (the storage is closed first)" if now else "as a server of its storage",
        )
        self.changed()

    def start(self) -> None:
        self.check()  # a change between choosing the mode and watching it
        self._files.start()

    async def stop(self) -> None:
        await self._files.stop()


class FencedApp:
    """What a fenced server answers: alive, never ready, and 503 ``FENCED`` for the rest
    (streams, replication, metrics). Touches no file but the fence file."""

    def __init__(self, fence_file: str) -> None:
        self.fence_file = fence_file

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        headers = {"cache-control": "no-store"}
        path = request.url.path
        if path == "/healthz":
            response: PlainTextResponse | JSONResponse = PlainTextResponse(
                "ok (fenced)\n", headers=headers
            )
        elif path == "/readyz":
            body = {"ready": False, "fenced": True, "problems": [MESSAGE]}
            response = JSONResponse(body, status_code=503, headers=headers)
        else:
            body = {"error": {"code": CODE, "message": MESSAGE}}
            response = JSONResponse(body, status_code=503, headers=headers)
        await response(scope, receive, send)
