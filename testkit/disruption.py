"""PodDisruptionBudgets and the Eviction API as Kubernetes applies them, for the emulated
API server (``testkit.kube.ApiServer`` serves ``POST .../pods/{name}/eviction`` with these).

Two parts of Kubernetes decide whether an eviction may go ahead, and both are here as
pure functions:

- the disruption controller (pkg/controller/disruption) keeps each budget's status:
  ``expectedPods`` is the number of pods for an integer ``minAvailable``, otherwise the
  sum of the ``spec.replicas`` of the pods' controllers (their scale); ``desiredHealthy``
  is ``minAvailable`` (a percentage rounded up) or ``expectedPods - maxUnavailable`` (a
  percentage rounded up, at least 0); ``currentHealthy`` counts the pods whose Ready
  condition is True, leaving out those being deleted; ``disruptionsAllowed`` is
  ``currentHealthy - desiredHealthy``, at least 0, and 0 when nothing is expected or the
  controllers cannot be found (``SyncFailed``);
- the eviction subresource (pkg/registry/core/pod/storage/eviction.go): a pod that is
  Pending, Succeeded, Failed or being deleted goes without a budget check; a pod under
  more than one budget is refused (500); a pod that is not Ready goes when its budget says
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, or under the default ``IfHealthyBudget``
  when the budget is met (``currentHealthy >= desiredHealthy > 0``); any other pod goes
  only while ``disruptionsAllowed > 0``, which the eviction then decrements, and is
  otherwise refused with 429 TooManyRequests and a ``DisruptionBudget`` cause.

The emulator has no controller loop: it brings a budget's status up to date when an
eviction asks for it, as if the disruption controller had just run. It deletes an evicted
pod at once (no graceful deletion; the kubelet stand-in sends SIGTERM when it sees the
pod gone), so the controller's ``disruptedPods`` map, which covers the time between an
eviction and the deletion it sees, is always empty here and is left out.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from typing import Any

# Word for word as kube-apiserver says them.
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
MANY_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
    "not support."
)
CAUSE = "DisruptionBudget"  # policyv1.DisruptionBudgetCause
ALWAYS_ALLOW = "AlwaysAllow"


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels. In
    policy/v1 an empty selector selects every pod of the namespace; a missing one none."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def selects(pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether the budget covers the pod (same namespace, selector matches)."""
    if pdb["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    return selector_matches(pdb["spec"].get("selector"), pod["metadata"].get("labels") or {})


def pod_ready(pod: dict[str, Any]) -> bool:
    """podutil.IsPodReady: the Ready condition is True (the readiness gates included)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def scaled(value: int | str, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent with rounding up: ``"50%"`` of 3 is 2."""
    if isinstance(value, int):
        return value
    if not value.endswith("%"):
        raise ValueError(f"invalid value for IntOrString: {value!r}")
    return math.ceil(int(value[:-1]) * total / 100)


def controller_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's controller owner reference (``controller: true``), if any."""
    refs = pod["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def expected_scale(
    pods: Sequence[dict[str, Any]], scale_of: Callable[[dict[str, Any]], int | None]
) -> int:
    """The sum of the scales of the pods' controllers, each counted once (pods without a
    controller are left out, as unmanaged). ``scale_of``: a controller reference's
    ``spec.replicas``, None when no controller by that uid exists."""
    scales: dict[str, int] = {}
    for pod in pods:
        ref = controller_of(pod)
        if ref is None or ref.get("uid") in scales:
            continue
        scale = scale_of(ref)
        if scale is None:
            raise LookupError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
        scales[ref["uid"]] = scale
    return sum(scales.values())


def budget_status(
    pdb: dict[str, Any],
    pods: Sequence[dict[str, Any]],
    scale: int | Callable[[dict[str, Any]], int | None],
) -> dict[str, Any]:
    """The budget's status as the disruption controller writes it, for the ``pods`` it
    selects; ``scale``: the controllers' total scale, or how to find each one's."""
    spec = pdb["spec"]
    generation = pdb["metadata"].get("generation", 1)
    current = sum(1 for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp"))
    try:
        if "maxUnavailable" in spec or isinstance(spec.get("minAvailable"), str):
            expected = scale if isinstance(scale, int) else expected_scale(pods, scale)
            if "maxUnavailable" in spec:
                desired = max(0, expected - scaled(spec["maxUnavailable"], expected))
            else:
                desired = scaled(spec["minAvailable"], expected)
        else:
            expected, desired = len(pods), int(spec.get("minAvailable") or 0)
    except (LookupError, ValueError) as exc:
        old = pdb.get("status") or {}
        return {
            **old,
            "observedGeneration": generation,
            "disruptionsAllowed": 0,
            "conditions": [_allowed_condition(pdb, False, "SyncFailed", str(exc))],
        }
    allowed = current - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    reason = "SufficientPods" if allowed > 0 else "InsufficientPods"
    return {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": current,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [_allowed_condition(pdb, allowed > 0, reason, "")],
    }


def _allowed_condition(pdb: dict[str, Any], ok: bool, reason: str, message: str) -> dict[str, Any]:
    """The DisruptionAllowed condition (a metav1.Condition: its lastTransitionTime is
    required, and moves only when the status does)."""
    status = "True" if ok else "False"
    old: dict[str, Any] = next(
        (
            c
            for c in (pdb.get("status") or {}).get("conditions") or []
            if c.get("type") == "DisruptionAllowed"
        ),
        {},
    )
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "lastTransitionTime": since
        or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def ignores_budgets(pod: dict[str, Any]) -> bool:
    """canIgnorePDB: a pod that is not running (Pending, Succeeded, Failed) or is being
    deleted disrupts nothing more by going."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Pending", "Succeeded", "Failed") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


class Refused(Exception):
    """An eviction refused: the HTTP code, reason, message and details of the Status."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def admit(pod: dict[str, Any], pdb: dict[str, Any], status: dict[str, Any]) -> bool:
    """Whether the eviction of ``pod`` under ``pdb`` (its ``status`` up to date) may go
    ahead; True when it uses up one of the budget's disruptions (the caller decrements),
    False when it goes without; raises Refused (429) when the budget forbids it."""
    if not pod_ready(pod):
        if pdb["spec"].get("unhealthyPodEvictionPolicy") == ALWAYS_ALLOW:
            return False
        current, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
        if current >= desired > 0:
            return False  # IfHealthyBudget: the application is not disrupted now
    if status.get("disruptionsAllowed", 0) > 0:
        return True
    name = pdb["metadata"]["name"]
    message = (
        f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods "
        f"and has {status.get('currentHealthy', 0)} currently"
    )
    raise Refused(
        429, "TooManyRequests", REFUSED, {"causes": [{"reason": CAUSE, "message": message}]}
    )
