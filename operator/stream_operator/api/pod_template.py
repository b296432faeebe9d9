"""What platform teams set on the server pods: ``spec.template`` (Strimzi's shape) and
the default placement of a replica set's pods.

- ``template.pod.metadata``: labels and annotations on every pod (a sidecar injector's
  or a cost tool's), under the operator's own: keys under ``streams.pyds.dev/`` and the
  selector's labels are the operator's and refused.
- ``template.serviceAccount.metadata``: on the pods' ServiceAccount ``<name>``, which a
  single server gets too once it is given: IRSA's ``eks.amazonaws.com/role-arn`` and GKE's
  ``iam.gke.io/gcp-service-account`` reach the bucket of ``spec.backup`` through it,
  with no keys in a Secret. A single server still mounts no API token (it calls no API).
- ``template.pod.securityContext`` and ``template.serverContainer.securityContext``
  replace the operator's (never merged, as ``resources``): given, they are what the pod
  runs with. On OpenShift the restricted SCC assigns each namespace's UID and refuses a
  fixed one outside its range: the operator's setting ``DS_OPERATOR_SERVER_FIXED_UID``
  (the chart's ``server.fixedUID``) false leaves runAsUser, runAsGroup and fsGroup out
  of the default for every DurableStream.
- ``scheduling.affinity`` left out, a replica set's pods prefer other nodes, then other
  zones, than their own set's pods (CloudNativePG's default, soft: a set still starts
  on one node). Given, the user's affinity is the whole affinity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stream_operator import GROUP
from stream_operator.configuration import operator_settings

UID = 10001  # the server image's user (images/durable-streams-server.Containerfile)
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
# The selector's labels: another value would take the pod out of its StatefulSet.
OPERATOR_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
)


def _meta(template: Mapping[str, Any], part: str) -> Mapping[str, Any]:
    return (template.get(part) or {}).get("metadata") or {}


def pod_labels(template: Mapping[str, Any], own: Mapping[str, str]) -> dict[str, str]:
    """The pods' labels: the user's, then the operator's (which win)."""
    return {**(_meta(template, "pod").get("labels") or {}), **own}


def pod_annotations(template: Mapping[str, Any], own: Mapping[str, str]) -> dict[str, str]:
    """The pods' annotations: the user's, then the operator's (which win)."""
    return {**(_meta(template, "pod").get("annotations") or {}), **own}


def wants_service_account(template: Mapping[str, Any]) -> bool:
    """Whether ``template.serviceAccount`` is given: a single server then gets its
    ServiceAccount too (a replica set always has one)."""
    return template.get("serviceAccount") is not None


def service_account_metadata(template: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The user's labels and annotations for the pods' ServiceAccount."""
    meta = _meta(template, "serviceAccount")
    return {k: dict(meta[k]) for k in ("labels", "annotations") if meta.get(k)}


def pod_security_context(template: Mapping[str, Any]) -> dict[str, Any]:
    """``template.pod.securityContext`` as given, or the operator's default (with the
    image's UID unless the platform assigns one)."""
    given = (template.get("pod") or {}).get("securityContext")
    if given is not None:
        return dict(given)
    fixed = (
        {"runAsUser": UID, "runAsGroup": UID, "fsGroup": UID}
        if operator_settings.current().server_fixed_uid
        else {}
    )
    return {
        **fixed,
        # The kubelet chowns the volume's files to fsGroup only when its root is not
        # already the group's (the default, Always, walks every file at each start).
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(template: Mapping[str, Any]) -> dict[str, Any]:
    """``template.serverContainer.securityContext`` as given, or the operator's."""
    given = (template.get("serverContainer") or {}).get("securityContext")
    if given is not None:
        return dict(given)
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def default_affinity(selector: Mapping[str, str]) -> dict[str, Any]:
    """A replica set's pods away from each other: other nodes first, then other zones.
    Preferred, not required: a set on one node (a laptop's cluster) still starts."""

    def term(weight: int, key: str) -> dict[str, Any]:
        return {
            "weight": weight,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": dict(selector)},
                "topologyKey": key,
            },
        }

    preferred = [term(100, HOSTNAME), term(50, ZONE)]
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}


SCHEDULING = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "priorityClassName",
)


def placement(
    scheduling: Mapping[str, Any], selector: Mapping[str, str], replicated: bool
) -> dict[str, Any]:
    """The pod spec's placement fields: ``spec.scheduling`` as given, and a replica set's
    default anti-affinity where no affinity is given (replaced by one, never merged)."""
    out = {key: scheduling[key] for key in SCHEDULING if scheduling.get(key)}
    if replicated and "affinity" not in out:
        out["affinity"] = default_affinity(selector)
    return out


def refused_template(template: Mapping[str, Any]) -> str | None:
    """Labels and annotations the operator owns, which the template may not set."""
    for part in ("pod", "serviceAccount"):
        meta = _meta(template, part)
        for kind in ("labels", "annotations"):
            for key in meta.get(kind) or {}:
                if key.startswith(f"{GROUP}/") or (kind == "labels" and key in OPERATOR_LABELS):
                    return (
                        f"template.{part}.metadata.{kind}: {key} is the operator's "
                        f"(it sets {', '.join(OPERATOR_LABELS)} and every {GROUP}/ key)"
                    )
    return None
