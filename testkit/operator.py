"""Run the real kopf operator, with its real handlers, against a ``testkit.cluster.Cluster``.

kopf runs in its own thread and event loop (on stop it cancels tasks it did
not create, so it must not share pytest's loop); the handlers' kubernetes
client is pointed at the same API server.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client

from testkit.cluster import Cluster
from testkit.kube_serve import api_server_process

# Status refreshes every second in tests instead of every five, and every
# DurableStream is reconciled again (drift undone) every second instead of every minute.
os.environ.setdefault("DS_OPERATOR_STATUS_INTERVAL", "1")
os.environ.setdefault("DS_OPERATOR_RESYNC_INTERVAL", "1")

# Generous: kopf's start (its first lists) and its stop (the periodic workers finish the
# round under way, up to 30 s: handlers.stop_periodic) take seconds on a loaded machine:
# 17-21 s to start (the first, with its imports) and 21 s to stop were measured at a load
# of 7-15 on 2 cores, past the 15 s and 20 s allowed before (the thread then left running).
START_PATIENCE = 60.0
STOP_PATIENCE = 60.0

_server_url: list[str] = [""]
_login_registered = False


def _registry() -> kopf.OperatorRegistry:
    global _login_registered
    import stream_operator.controllers.handlers  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    if not _login_registered:

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=_server_url[0], insecure=True)

        _login_registered = True
    return registry


@contextmanager
def running_operator(cluster: Cluster, namespaces: Sequence[str] = ()) -> Iterator[None]:
    """The operator, cluster-wide or watching only ``namespaces``, for the length of the block.

    Watching namespaces, the operator's settings turn kopf's cluster-wide scanning off
    (it would list ``/api/v1/namespaces``, which kmock cannot parse, and which the
    chart's Roles do not grant): the namespaces are taken as named.
    """
    from stream_operator.configuration import operator_settings
    from stream_operator.kube import api_client

    operator_settings.load()  # as the operator's main does: the environment as it is now
    registry = _registry()
    _server_url[0] = cluster.url
    api_client.use_api_client(api_client.new_api_client(client.Configuration(host=cluster.url)))
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    standalone=True,
                    clusterwide=not namespaces,
                    namespaces=list(namespaces),
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as exc:  # reported to the test below
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="kopf")
    thread.start()
    try:
        if not ready.wait(START_PATIENCE):
            raise RuntimeError(f"the operator did not start: {failure}")
        yield
    finally:
        stop.set()
        thread.join(STOP_PATIENCE)
    if thread.is_alive():
        # Left running, it would share the handlers' module state (the periodic workers)
        # with the next test's operator: its late cleanup could stop the new one's rounds.
        raise RuntimeError(f"the operator did not stop within {STOP_PATIENCE} s")
    if failure:
        raise failure[0]


@contextmanager
def operated_api_server(where: Path) -> Iterator[Cluster]:
    """The emulated API server as its own process (``testkit.kube_serve``) with the real
    kopf operator on it, as the end-to-end operator tests run them; pod URLs are back to
    cluster DNS names afterwards (a test may point the operator at the stand-in's pods)."""
    from stream_operator.controllers import replica_set

    try:
        with api_server_process(where) as c, running_operator(c):
            yield c
    finally:
        replica_set.use_pod_urls(None)
