"""``kubectl dstream restart``: every pod in turn, or one pod now.

A rolling restart is asked for as ``kubectl cnpg restart`` asks it of a Cluster: the
DurableStream gets ``kubectl.kubernetes.io/restartedAt`` (the annotation ``kubectl
rollout restart`` writes on a pod template), and the operator copies it into its
StatefulSet's template (``stream_operator.decisions.lifecycle.restarted``). A new template is a new
revision, which the operator rolls as it rolls any other: one server replaced at a time
by the StatefulSet controller, and a replica set's pods by the operator itself, the
standbys first and the primary last, after a switchover (``stream_operator.decisions.rollout``).
``kubectl rollout restart`` of the StatefulSet would not do: a replica set's StatefulSet
is ``OnDelete`` (nothing would restart), and the operator's next apply would take the
edit out again.

``--pod`` deletes that one pod now (its StatefulSet makes it again), as ``kubectl cnpg
restart CLUSTER INSTANCE`` restarts one instance. CloudNativePG restarts a primary in
place, without a failover; a server here cannot restart in place, and deleting the
primary's pod makes the set fail over as after a crash (writes refused for up to a Lease
duration, those in flight answered 503). So the primary's pod is refused unless
``--force``, and the way to restart it without that is named: a switchover first, or a
rolling restart. A single server has no standby: its pod is deleted as asked (a restart
means a pause either way).
"""

from __future__ import annotations

import datetime
from typing import TextIO

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator.api.spec import spec_of
from stream_operator.decisions.lifecycle import RESTARTED_AT
from stream_operator.plugin import PluginError
from stream_operator.plugin.commands import (
    TIMEOUT,
    _annotate,
    _failed,
    members,
    read_stream,
)


def pod_of(ds_name: str, pods: list[str], given: str) -> str:
    """``N`` or ``<name>-N``: the pod, or a clear refusal."""
    pod = f"{ds_name}-{given}" if given.isdigit() else given
    if pod not in pods:
        raise PluginError(f"{given} is not a pod of {ds_name} ({', '.join(pods)})")
    return pod


def restart(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    pod: str | None,
    force: bool,
    out: TextIO,
    now: datetime.datetime | None = None,
) -> int:
    ds = read_stream(api, namespace, name)
    replicated = spec_of(ds).replicated
    if pod is None:
        when = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            _annotate(api, namespace, name, {RESTARTED_AT: when})
        except ApiException as exc:
            raise _failed(exc, f"annotate DurableStream {name}") from None
        how = (
            "the standbys one at a time, then the primary after a switchover"
            if replicated
            else "its server"
        )
        out.write(
            f"durablestream/{name} annotated {RESTARTED_AT}={when}: the operator restarts {how}\n"
        )
        return 0
    target = pod_of(name, members(ds), pod)
    primary = (ds.get("status") or {}).get("primary")
    if replicated and target == primary and not force:
        raise PluginError(
            f"{target} is the primary: deleting its pod fails the set over as a crash would "
            "(writes refused until a standby takes the Lease). Switch over first "
            f"(kubectl dstream switchover {name} POD), restart every pod with the primary "
            f"last (kubectl dstream restart {name}), or pass --force"
        )
    try:
        client.CoreV1Api(api).delete_namespaced_pod(target, namespace, _request_timeout=TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            raise PluginError(f"pod {target} does not exist (yet): nothing to restart") from None
        raise _failed(exc, f"delete pod {target}") from None
    out.write(f"pod/{target} deleted: its StatefulSet makes it again\n")
    return 0
