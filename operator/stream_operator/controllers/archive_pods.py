"""Which pod the operator asks about the archive, and how it reaches it.

A base backup is taken on an in-sync standby when the set has one (CloudNativePG's
``prefer-standby``: the primary's disk and network stay for the clients), else on the
primary; the archive's status is the primary's (only the primary archives). Roles
come from the Lease as the servers wrote it (replica_roles.py); a pod counts only when
the kubelet says it is ready. A single server is its own primary.

The call carries the replica set's peer token and checks a TLS server against the CA
in its TLS Secret, exactly as the switchover call does (replica_set._switch_over).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from stream_operator.api.spec import DurableStreamSpec
from stream_operator.controllers import replica_set
from stream_operator.controllers.token_rotation import sent_token
from stream_operator.decisions.replica_roles import LeaseView, pod_name, pod_ready
from stream_operator.kube.apply import read_secret_value
from stream_operator.kube.switchover_call import TOKEN_KEY
from stream_operator.specs.certificates import with_certificate
from stream_operator.specs.render import replication_secret_name


@dataclass(frozen=True)
class Choice:
    """The pod chosen (empty: none) and, when none, why."""

    pod: str = ""
    why: str = ""
    role: str = ""  # primary or standby


def choose_backup_pod(
    name: str,
    replicated: bool,
    view: LeaseView,
    pods: Sequence[Mapping[str, Any]],
    target: str,
) -> Choice:
    """Where a backup of ``name`` runs: ``target`` is ``prefer-standby`` or ``primary``."""
    ready = {pod_name(p) for p in pods if pod_ready(p)}
    if not replicated:
        pod = f"{name}-0"
        return Choice(pod, role="primary") if pod in ready else Choice(why=f"{pod} is not ready")
    if not view.holder:
        return Choice(why="no primary elected yet")
    if target == "prefer-standby":
        standbys = sorted(n for n in view.in_sync if n in ready and n != view.holder)
        if standbys:
            return Choice(standbys[0], role="standby")
    if view.holder in ready:
        return Choice(view.holder, role="primary")
    return Choice(why=f"the primary {view.holder} is not ready and no standby is in sync")


def primary_pod(name: str, replicated: bool, view: LeaseView) -> str:
    """The pod that archives (empty: no primary elected yet)."""
    return view.holder if replicated else f"{name}-0"


@dataclass(frozen=True)
class Access:
    """A pod's origin and what a call to it shows and checks."""

    origin: str
    token: str | None
    verify: bool | str


def access(
    ac: client.ApiClient, ds: Mapping[str, Any], spec: DurableStreamSpec, pod: str
) -> Access:
    """How to call ``pod`` of ``ds``: its origin, the peer token (a replica set's), and
    the CA its certificate is checked against."""
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    spec = with_certificate(name, spec)
    token = None
    if spec.replicated:
        token = sent_token(
            read_secret_value(ac, namespace, replication_secret_name(name), TOKEN_KEY)
        )
    verify: bool | str = True
    if spec.server.tls_secret_name:
        verify = read_secret_value(ac, namespace, spec.server.tls_secret_name, "ca.crt") or True
    return Access(replica_set.pod_origin(name, namespace, pod, spec), token, verify)
