"""A replica set's scale carried out: the scale-down refused while it would remove the
primary or leave a lagging pod alone (``replica_roles.refused_scale_down``), and at one
replica the old set's Lease and the removed pods' claims deleted once those pods are gone
(``scaling.plan_scaling``). Glue, like ``lifecycle_actions``: the decisions are pure."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from stream_operator.api.spec import DurableStreamSpec
from stream_operator.controllers.periodic import Periodic
from stream_operator.decisions import scaling
from stream_operator.decisions.replica_roles import lease_view, refused_scale_down
from stream_operator.kube import events, leadership
from stream_operator.kube.apply import delete, instance_pods, instance_pvcs, read_lease
from stream_operator.specs.render import lease_name


def _live_replicas(sts: dict[str, Any]) -> int:
    return int((sts.get("spec") or {}).get("replicas") or 0)


def refused(
    ac: client.ApiClient, ds: dict[str, Any], spec: DurableStreamSpec, sts: dict[str, Any] | None
) -> str | None:
    """Why a scale-down is refused until the user has failed over, or None."""
    if sts is None:
        return None
    current, wanted = _live_replicas(sts), spec.replicas
    if wanted >= current:
        return None
    meta = ds["metadata"]
    view = lease_view(read_lease(ac, meta["namespace"], lease_name(meta["name"])))
    return refused_scale_down(meta["name"], current, wanted, view)


def plan(
    ac: client.ApiClient,
    ds: dict[str, Any],
    spec: DurableStreamSpec,
    sts: dict[str, Any] | None,
    pods: list[dict[str, Any]] | None,
    rounds: Periodic,
) -> scaling.ScalePlan:
    """At one replica, the old set's Lease and the removed pods' claims deleted once the
    removed pods are gone; the replicas the StatefulSet may have now (scaling.py).
    ``pods``: the instance's pods, if already listed. Reads nothing more unless the
    StatefulSet is at one pod. A cleanup done brings the object's next round forward."""
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    if sts is None or _live_replicas(sts) != 1:
        return scaling.ScalePlan(spec.replicas)
    made = scaling.plan_scaling(
        name,
        spec.replicas,
        sts,
        instance_pods(ac, namespace, name) if pods is None else pods,
        instance_pvcs(ac, namespace, name),
        read_lease(ac, namespace, lease_name(name)),
    )
    if made.deletes and leadership.may_act():
        if made.delete_lease:
            delete(ac, "Lease", namespace, lease_name(name))
        for claim in made.delete_claims:
            delete(ac, "PersistentVolumeClaim", namespace, claim)
        events.info(ds, reason="ScaledToOne", message=scaling.cleaned_message(name, made))
        rounds.due(namespace, name)  # a waiting scale-up goes on in the next round
    return made
