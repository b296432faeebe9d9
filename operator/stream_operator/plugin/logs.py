"""``kubectl dstream logs``: the servers' logs, every pod's (or one's), each line prefixed
with its pod as ``kubectl logs --prefix`` prefixes it (``[pod/NAME/server]``).

Read through the API server's ``pods/log`` subresource, as ``kubectl logs`` reads them:
the current run, or the one before the last restart (``--previous``), from ``--since``
ago on. ``--follow`` follows every pod at once (a thread each) until each log ends or
the user stops it (Ctrl-C); lines of different pods are whole lines, never mixed.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator.decisions.rollout import SERVER_CONTAINER
from stream_operator.plugin import PluginError
from stream_operator.plugin.commands import TIMEOUT, _failed, _pods, read_stream
from stream_operator.plugin.restart import pod_of

_UNITS = {"s": 1, "m": 60, "h": 3600}


def since_seconds(raw: str | None) -> int | None:
    """``--since`` as kubectl reads it (a Go duration: ``90s``, ``5m``, ``1h30m``)."""
    if raw is None:
        return None
    parts = re.findall(r"(\d+)([hms])", raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        raise PluginError(f"--since {raw}: not a duration such as 30s, 5m or 1h30m")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise PluginError("--since must be more than 0s")
    return seconds


def read_log(
    api: client.ApiClient,
    namespace: str,
    pod: str,
    *,
    previous: bool = False,
    since: int | None = None,
    follow: bool = False,
) -> Iterator[str]:
    """The lines of one pod's server log, as they come (``follow``: until it ends)."""
    extra: dict[str, Any] = {"since_seconds": since} if since else {}
    if not follow:  # following, it waits as long as the log is open, as kubectl logs -f
        extra["_request_timeout"] = TIMEOUT
    raw: Any = client.CoreV1Api(api).read_namespaced_pod_log(
        pod,
        namespace,
        container=SERVER_CONTAINER,
        previous=previous,
        follow=follow,
        _preload_content=False,
        **extra,
    )
    try:
        pending = b""
        for chunk in raw.stream(4096):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")
    finally:
        raw.release_conn()


def logs(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    pod: str | None,
    follow: bool,
    since: str | None,
    previous: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """Every pod's log (1 when a pod's could not be read: said on ``err``)."""
    read_stream(api, namespace, name)
    seconds = since_seconds(since)
    running = sorted(p["metadata"]["name"] for p in _pods(api, namespace, name))
    chosen = [pod_of(name, running, pod)] if pod is not None else running
    if not chosen:
        raise PluginError(f"{name} has no pods (hibernated, or not started yet)")
    lock = threading.Lock()
    failed: list[str] = []

    def copy(one: str) -> None:
        try:
            for line in read_log(
                api, namespace, one, previous=previous, since=seconds, follow=follow
            ):
                with lock:
                    out.write(f"[pod/{one}/{SERVER_CONTAINER}] {line}\n")
                    if follow:
                        out.flush()
        except ApiException as exc:
            with lock:
                failed.append(one)
                err.write(f"error: {_failed(exc, f'read the log of {one}')}\n")

    if follow and len(chosen) > 1:
        threads = [threading.Thread(target=copy, args=(p,), daemon=True) for p in chosen]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for one in chosen:
            copy(one)
    return 1 if failed else 0
