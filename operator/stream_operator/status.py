"""What the status says, computed from what was observed (never from what was hoped).

Input: the DurableStream's spec and generation, the StatefulSet as the API
returns it (or None), and a refusal reason if the last change was refused.
Output: the status dict the operator writes.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from stream_operator.spec import with_defaults


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(ctype: str, ok: bool, reason: str, message: str) -> dict[str, str]:
    return {
        "type": ctype,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
    }


def analytics_condition(
    *,
    error: str | None = None,
    spark_operator: bool = True,
    scheduled: Sequence[dict[str, Any]] = (),
) -> list[dict[str, str]]:
    """The Analytics condition: the renderer's refusal, a missing Spark Operator, or the
    ScheduledSparkApplications in place (none when analytics is off)."""
    if error is not None:
        return [condition("Analytics", False, "InvalidAnalytics", error)]
    if not spark_operator:
        message = "spec.analytics is enabled, but the Spark Operator is not installed"
        return [condition("Analytics", False, "SparkOperatorMissing", message)]
    if not scheduled:
        return []
    schedule = scheduled[0]["spec"]["schedule"]
    message = f"{len(scheduled)} ScheduledSparkApplication(s), schedule {schedule}"
    return [condition("Analytics", True, "Scheduled", message)]


def compute_status(
    *,
    spec: dict[str, Any],
    generation: int | None,
    statefulset: dict[str, Any] | None,
    endpoint: str,
    refused: str | None = None,
    previous: dict[str, Any] | None = None,
    extra: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """``extra``: conditions of optional parts (Analytics), decided where they are applied."""
    want = with_defaults(spec)["replicas"]
    conditions = []
    if statefulset is None:
        ready = 0
        phase = "Pending"
        conditions += [
            condition("Ready", False, "NoStatefulSet", "the StatefulSet has not been created yet"),
            condition("Progressing", True, "Creating", "creating the server StatefulSet"),
            condition("Degraded", False, "NoStatefulSet", "nothing to degrade yet"),
        ]
    else:
        st = statefulset.get("status") or {}
        meta = statefulset.get("metadata") or {}
        ready = int(st.get("readyReplicas") or 0)
        updated = int(st.get("updatedReplicas") or 0)
        current = int(st.get("replicas") or 0)
        rolling = (
            (st.get("observedGeneration") or 0) < (meta.get("generation") or 0)
            or (st.get("updateRevision") and st.get("currentRevision") != st.get("updateRevision"))
            or updated < want
            or current != want
        )
        all_ready = ready >= want and not rolling
        if all_ready:
            phase = "Ready"
            conditions.append(
                condition("Ready", True, "AllReplicasReady", f"{ready}/{want} servers ready")
            )
        else:
            phase = "Progressing" if rolling else "Degraded"
            conditions.append(
                condition("Ready", False, "ReplicasNotReady", f"{ready}/{want} servers ready")
            )
        conditions.append(
            condition(
                "Progressing",
                bool(rolling),
                "RollingUpdate" if rolling else "Stable",
                f"{updated}/{want} servers on the current revision",
            )
        )
        degraded = ready < want and not rolling
        conditions.append(
            condition(
                "Degraded",
                degraded,
                "PodsNotReady" if degraded else "AsExpected",
                f"{want - ready} server(s) not ready" if degraded else "all servers ready",
            )
        )
    if refused:
        conditions.append(condition("Accepted", False, "ChangeRefused", refused))
        if phase == "Ready":
            phase = "Degraded"
    else:
        conditions.append(condition("Accepted", True, "Applied", "the spec is applied"))
    conditions += list(extra)
    return {
        "phase": phase,
        "replicas": want,
        "readyReplicas": ready,
        "endpoint": endpoint,
        "observedGeneration": generation,
        "conditions": _stamp(conditions, (previous or {}).get("conditions") or []),
    }


def _stamp(
    conditions: list[dict[str, str]], previous: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Keep lastTransitionTime unless the condition's status changed."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in conditions:
        old = before.get(c["type"])
        stamp = old.get("lastTransitionTime") if old and old.get("status") == c["status"] else None
        out.append({**c, "lastTransitionTime": stamp or _now()})
    return out
