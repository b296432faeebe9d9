"""A replica set's part of each status round: the role labels the client Services select
on, one step of its rolling update carried out (a pod deleted, or a switchover asked of
the primary), and an Event for every change of primary.

Glue, like ``handlers``: the decisions are pure functions in ``replica_roles`` and
``rollout``; this module reads and writes through the API client it is given (the
handlers' own, which refuses writes once this operator lost its Lease) and makes the one
call to a server (``switchover``). ``handlers`` calls it under the object's lock.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator.api.spec import DurableStreamSpec, spec_of
from stream_operator.controllers.token_rotation import sent_token
from stream_operator.decisions.replica_roles import (
    in_sync_changes,
    lease_view,
    relabel_order,
    wanted_roles,
)
from stream_operator.decisions.rollout import (
    SWITCHOVER_TO,
    WAITING_FOR_SWITCHOVER,
    Step,
    failed_switchover,
    plan_rollout,
    requested_switchover,
)
from stream_operator.kube import events, leadership
from stream_operator.kube.apply import (
    delete_pod,
    label_pod,
    read_secret_value,
    remove_annotation,
    set_pod_condition,
)
from stream_operator.kube.switchover_call import TOKEN_KEY, request_switchover
from stream_operator.specs.certificates import with_certificate
from stream_operator.specs.render import IN_SYNC, ROLE, pod_url, replication_secret_name

# (name, namespace, pod, spec) -> the origin a replica set's pod answers at: its DNS name
# through the headless Service in a cluster; tests point it at a real local server.
PodURL = Callable[[str, str, str, DurableStreamSpec], str]
_pod_url: list[PodURL] = [pod_url]


def use_pod_urls(resolve: PodURL | None) -> None:
    """Where the operator reaches the servers' pods (None: their cluster DNS names)."""
    _pod_url[0] = resolve or pod_url


def pod_origin(name: str, namespace: str, pod: str, spec: DurableStreamSpec) -> str:
    """Where the operator reaches ``pod`` of the DurableStream ``name`` (``use_pod_urls``)."""
    return _pod_url[0](name, namespace, pod, spec)


# The switchovers this operator made, (namespace, name) -> the new primary: the Event
# for that change of primary says "switchover" for certain.
_switched: dict[tuple[str, str], str] = {}


def roll(
    ac: client.ApiClient,
    ds: dict[str, Any],
    sts: dict[str, Any],
    pods: list[dict[str, Any]],
    lease: Any,
) -> Step | None:
    """One step of a replica set's rolling update (rollout.py), carried out; None when the
    live StatefulSet is not OnDelete (its controller rolls the pods) or writes are not
    ours to make."""
    if not leadership.may_act():
        return None
    if ((sts.get("spec") or {}).get("updateStrategy") or {}).get("type") != "OnDelete":
        return None
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    previous = next(
        (
            c.get("reason")
            for c in (ds.get("status") or {}).get("conditions") or []
            if c.get("type") == "Progressing"
        ),
        None,
    )
    st = sts.get("status") or {}
    # The controller has not seen the newest template yet: its updateRevision is old.
    seen = (st.get("observedGeneration") or 0) >= (
        (sts.get("metadata") or {}).get("generation") or 0
    )
    step = plan_rollout(
        name,
        int((sts.get("spec") or {}).get("replicas") or 0),
        st.get("updateRevision") if seen else None,
        pods,
        lease_view(lease),
        previous,
        spec_of(ds).primary_update_strategy,
    )
    asked = (meta.get("annotations") or {}).get(SWITCHOVER_TO)
    if step.reason == WAITING_FOR_SWITCHOVER and previous != step.reason and not asked:
        events.info(ds, reason=step.reason, message=step.message)
    if step.delete is not None:
        if delete_pod(ac, namespace, step.delete):
            events.info(
                ds, reason=step.reason, message=f"deleted pod {step.delete}: {step.message}"
            )
    elif step.switchover is not None:
        step = _switch_over(ac, ds, step, f"before updating {step.switchover[0]}")
    elif asked and (not step.rolling or step.reason == WAITING_FOR_SWITCHOVER):
        # Supervised: the user's switchover is the step the rolling update waits for.
        step = _requested(ac, ds, sts, asked, lease) or step
    return step


def _requested(
    ac: client.ApiClient, ds: dict[str, Any], sts: dict[str, Any], target: str, lease: Any
) -> Step | None:
    """One attempt at the switchover the annotation asks for, then the annotation goes,
    whatever came of it, with an Event saying what. A failed attempt is not repeated by
    itself: each one may hold writes up to the switchover timeout. A crash between the
    two leaves the annotation, and the next round finds the target primary already."""
    meta = ds["metadata"]
    replicas = int((sts.get("spec") or {}).get("replicas") or 0)
    decision = requested_switchover(meta["name"], replicas, target, lease_view(lease))
    step = None
    if isinstance(decision, str):
        done = decision.endswith("the primary already")
        (events.info if done else events.warn)(
            ds, reason="SwitchoverRequest", message=f"{SWITCHOVER_TO}={target}: {decision}"
        )
    else:
        step = _switch_over(
            ac,
            ds,
            decision,
            f"asked for with {SWITCHOVER_TO}",
            retry=f"not retried: annotate {SWITCHOVER_TO} again to retry",
        )
    remove_annotation(ac, meta["namespace"], meta["name"], SWITCHOVER_TO)
    return step


def _switch_over(
    ac: client.ApiClient,
    ds: dict[str, Any],
    step: Step,
    purpose: str,
    retry: str = "trying again in the next round",
) -> Step:
    """Ask the primary to hand its Lease to the step's target; the step that resulted.
    ``purpose`` ends the Event's message; ``retry`` says what follows a failure."""
    assert step.switchover is not None
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    spec = with_certificate(name, spec_of(ds))
    source, target = step.switchover
    token = sent_token(read_secret_value(ac, namespace, replication_secret_name(name), TOKEN_KEY))
    if token is None:
        return failed_switchover(
            step, f"Secret {replication_secret_name(name)} has no token", retry
        )
    verify: bool | str = True
    tls = spec.server.tls_secret_name
    if tls:
        verify = read_secret_value(ac, namespace, tls, "ca.crt") or True
    answer = request_switchover(
        _pod_url[0](name, namespace, source, spec), token, target, verify=verify
    )
    if not answer.ok:
        failed = failed_switchover(step, answer.why, retry)
        events.warn(ds, reason="SwitchoverFailed", message=failed.message)
        return failed
    _switched[(namespace, name)] = answer.primary
    message = (
        f"switchover {source} -> {answer.primary} (term {answer.term}, writes held "
        f"{answer.paused_ms:.0f} ms) {purpose}"
    )
    events.info(ds, reason="Switchover", message=message)
    return step


def label_roles(
    ac: client.ApiClient, namespace: str, pods: list[dict[str, Any]], lease: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Label each pod with the role the Lease gives it (the client Services select on it);
    returns the pods as labelled now.

    Demotions are written before the promotion, so the primary Service never selects two
    pods. The Lease holder labels the pods itself as it takes the Lease
    (stream_server.replication.lease.pod_labels); this is the backstop, within one status
    interval, for a server that could not (an older image, the API unreachable for it).
    The in-sync readiness gate's conditions are set the same way (``mark_in_sync``).
    """
    if not leadership.may_act():
        return pods
    current = {p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(ROLE) for p in pods}
    changes = relabel_order(current, wanted_roles(lease_view(lease), pods))
    for pod, role in changes:
        label_pod(ac, namespace, pod, {ROLE: role})
    mark_in_sync(ac, namespace, pods, lease)
    roles = dict(changes)
    return [
        {
            **p,
            "metadata": {
                **p["metadata"],
                "labels": {**(p["metadata"].get("labels") or {}), ROLE: roles[n]},
            },
        }
        if (n := p["metadata"]["name"]) in roles
        else p
        for p in pods
    ]


def mark_in_sync(
    ac: client.ApiClient, namespace: str, pods: list[dict[str, Any]], lease: dict[str, Any] | None
) -> None:
    """Set each pod's in-sync condition (the readiness gate) from the Lease where it says
    otherwise: the primary sets them as the in-sync set changes, and this round catches
    what it could not write. Pods without the gate (a StatefulSet not yet rolled to a
    template with it) are left alone."""
    view = lease_view(lease)
    gated = [
        p
        for p in pods
        if any(
            g.get("conditionType") == IN_SYNC
            for g in (p.get("spec") or {}).get("readinessGates") or []
        )
    ]
    for pod, in_sync in in_sync_changes(view, gated, IN_SYNC):
        condition = {
            "type": IN_SYNC,
            "status": str(in_sync),
            "reason": "InSync" if in_sync else "NotInSync",
            "message": f"{'in' if in_sync else 'not in'} the in-sync set of term "
            f"{view.term} (set by the operator from the Lease)",
            "lastTransitionTime": datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        }
        try:
            set_pod_condition(ac, namespace, pod, condition)
        except ApiException as exc:
            if exc.status != 404:  # a pod deleted since it was listed: nothing to mark
                raise


def tell_primary_change(ds: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
    """An Event for every new term the status records, saying what it was: a switchover
    when this operator asked for it or the Lease says the primary handed it over
    (``termBegan``: a switchover asked of a server directly, or a primary's hand-over
    as it stopped) (Normal), else a failover (Warning), even when the status never
    showed it: a primary killed and back within one status interval, its pod never
    seen not ready, still starts a new term, to the same pod or another."""
    meta = ds["metadata"]
    before, after = old.get("primary") or "", new.get("primary") or ""
    if not after or (before == after and old.get("term") == new.get("term")):
        return
    if before:
        ours = _switched.pop((meta["namespace"], meta["name"]), None) == after
        handed = ours or new.get("termBegan") == "switchover"
        kind = "switchover" if handed else "failover"
        moved = f"{before} -> {after}" if before != after else f"{after} again"
        message = f"{kind}: primary {moved} (term {new.get('term')})"
        if handed and not ours:
            message += ", handed over by the primary"
        (events.info if handed else events.warn)(ds, reason="PrimaryChanged", message=message)
    else:
        events.info(
            ds, reason="PrimaryElected", message=f"primary {after} (term {new.get('term')})"
        )
