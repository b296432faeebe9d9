"""What ``kubectl dstream status`` says, from the objects as the API returns them: pure.

The DurableStream's status (phase, the conditions that are not as they should be,
endpoint, each replica's role, in-sync flag, ``[term, lsn]`` position and lag as the
operator last wrote them), the Lease as the servers wrote it (holder, term, how the term
began, the in-sync set), each Pod's readiness and restarts (the kubelet's word), the
newest ``PrimaryChanged``/``Switchover`` Event (the last change of primary), and, with
``--live``, each pod's own ``GET /replication`` answer. ``build`` makes the report (the
``-o json`` output), ``render`` the table a person reads.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any

from stream_operator.api.spec import spec_of
from stream_operator.decisions.replica_roles import lease_view, pod_name, pod_ready
from stream_operator.decisions.rollout import SWITCHOVER_TO
from stream_operator.plugin import FENCE_ALL, FENCED, HIBERNATION, RECONCILE

# Each condition's status when all is well; one of another type is always shown.
EXPECTED = {
    "Ready": "True",
    "Progressing": "False",
    "Degraded": "False",
    "FailingOver": "False",
    "Accepted": "True",
    "Analytics": "True",
    "Drainable": "True",
    "Certificates": "True",
    "Hibernated": "False",
    "Fenced": "False",
    "ReconcilePaused": "False",
    "ContinuousArchiving": "True",
}
# The Events that record a change of primary (stream_operator.controllers.replica_set).
PRIMARY_EVENTS = ("PrimaryChanged", "Switchover")
# The annotations a user sets (docs/kubernetes.md), as the report names them.
USER_ANNOTATIONS = {
    HIBERNATION: "hibernation",
    FENCED: "fencedInstances",
    RECONCILE: "reconcile",
    SWITCHOVER_TO: "switchoverTo",
}


def event_time(event: Mapping[str, Any]) -> str:
    """When an Event last happened: ``eventTime`` (events.k8s.io), else ``lastTimestamp``,
    ``firstTimestamp``, else when the object was made."""
    meta = event.get("metadata") or {}
    for stamp in (
        event.get("eventTime"),
        event.get("lastTimestamp"),
        event.get("firstTimestamp"),
        meta.get("creationTimestamp"),
    ):
        if stamp:
            return str(stamp)
    return ""


def _parse(stamp: str) -> datetime.datetime | None:
    try:
        when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def last_primary_change(
    events: Sequence[Mapping[str, Any]], name: str, uid: str = ""
) -> dict[str, str] | None:
    """The newest PrimaryChanged or Switchover Event of the DurableStream ``name`` (of this
    incarnation, ``uid``, when the Event names one), or None."""
    ours = [
        e
        for e in events
        if e.get("reason") in PRIMARY_EVENTS
        and (e.get("involvedObject") or {}).get("name") == name
        and (e.get("involvedObject") or {}).get("kind") in (None, "DurableStream")
        and (not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid))
    ]
    if not ours:
        return None
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    newest = max(ours, key=lambda e: _parse(event_time(e)) or epoch)
    return {
        "reason": str(newest.get("reason") or ""),
        "type": str(newest.get("type") or ""),
        "time": event_time(newest),
        "message": str(newest.get("message") or ""),
    }


def _ordinal(pod: str) -> tuple[int, str]:
    match = re.search(r"-(\d+)$", pod)
    return (int(match.group(1)) if match else 1 << 30, pod)


def _restarts(pod: Mapping[str, Any]) -> int:
    return sum(
        int(cs.get("restartCount") or 0)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _fenced(annotations: Mapping[str, str], pod: str) -> bool:
    raw = annotations.get(FENCED) or ""
    return f'"{pod}"' in raw or f'"{FENCE_ALL}"' in raw


def live_view(answers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each pod's own ``GET /replication`` answer, boiled down: its role, durable
    ``[term, lsn]``, its problem, and its lag in batches behind the primary as the primary
    counts it now (from the primary's ``followers``). ``answers``: pod -> the JSON
    answer, or ``{"error": why}`` when the pod did not answer."""
    primary = next(
        (a for a in answers.values() if a.get("role") == "primary" and "error" not in a), None
    )
    head = ((primary or {}).get("durable") or {}).get("lsn")
    followers = (primary or {}).get("followers") or {}
    out: dict[str, dict[str, Any]] = {}
    for pod, answer in answers.items():
        if "error" in answer:
            out[pod] = {"error": str(answer["error"])}
            continue
        durable = answer.get("durable") or {}
        entry: dict[str, Any] = {
            "role": answer.get("role"),
            "durable": [durable.get("term"), durable.get("lsn")],
            "problem": answer.get("problem"),
        }
        if answer is primary:
            entry["lagBatches"] = 0
        elif isinstance(head, int) and isinstance((followers.get(pod) or {}).get("lsn"), int):
            entry["lagBatches"] = max(0, head - followers[pod]["lsn"])
        out[pod] = entry
    return out


def build(
    ds: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    lease: Mapping[str, Any] | None,
    *,
    lease_error: str = "",
    live: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report: ``lease`` None with ``lease_error`` empty means the set has no Lease
    (one replica, or no server took it yet); ``lease_error`` says why it was not read."""
    meta = ds.get("metadata") or {}
    status = ds.get("status") or {}
    name = str(meta.get("name") or "")
    annotations = meta.get("annotations") or {}
    replicas = spec_of(ds).replicas
    report: dict[str, Any] = {
        "name": name,
        "namespace": meta.get("namespace"),
        "phase": status.get("phase") or "Unknown",
        "replicas": replicas,
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "endpoint": status.get("endpoint") or "",
        "generation": meta.get("generation"),
        "observedGeneration": status.get("observedGeneration"),
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or []
            if EXPECTED.get(str(c.get("type"))) != c.get("status")
        ],
        "annotations": {
            label: annotations[key] for key, label in USER_ANNOTATIONS.items() if key in annotations
        },
        "primary": status.get("primary"),
        "term": status.get("term"),
        "termBegan": status.get("termBegan"),
        "inSyncReplicas": status.get("inSyncReplicas"),
    }
    if lease is not None:
        view = lease_view(lease)
        report["lease"] = {
            "name": (lease.get("metadata") or {}).get("name"),
            "holder": view.holder,
            "term": view.term,
            "termBegan": view.began,
            "inSync": sorted(view.synced),
            "renewTime": (lease.get("spec") or {}).get("renewTime"),
            "leaseDurationSeconds": view.duration,
        }
    elif lease_error:
        report["lease"] = {"error": lease_error}
    else:
        report["lease"] = None
    by_pod = {pod_name(p): p for p in pods if pod_name(p)}
    states = {str(s.get("name")): s for s in status.get("replicaStatus") or [] if s.get("name")}
    rows = []
    lives = live_view(live) if live is not None else {}
    for pod in sorted({*by_pod, *states}, key=_ordinal):
        state = states.get(pod, {})
        obj = by_pod.get(pod)
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        row: dict[str, Any] = {
            "pod": pod,
            "role": state.get("role") or labels.get("streams.pyds.dev/role"),
            "ready": pod_ready(obj) if obj is not None else None,
            "inSync": state.get("inSync"),
            "position": state.get("position"),
            "lagBatches": state.get("lagBatches"),
            "restarts": _restarts(obj) if obj is not None else None,
            "fenced": _fenced(annotations, pod),
        }
        if obj is None:
            row["missing"] = True
        if live is not None:
            row["live"] = lives.get(pod, {"error": "not asked (no such pod)"})
        rows.append(row)
    report["pods"] = rows
    report["lastPrimaryChange"] = last_primary_change(events, name, str(meta.get("uid") or ""))
    report["archive"] = _archive(ds)
    return report


def _archive(ds: Mapping[str, Any]) -> dict[str, Any] | None:
    """The archive's part of the status (None: the DurableStream has no archive)."""
    spec = spec_of(ds)
    status = ds.get("status") or {}
    if spec.backup is None and not spec.replica.enabled:
        return None
    store = spec.replica.source if spec.replica.enabled else None
    if store is None and spec.backup is not None:
        store = spec.backup.object_store
    keys = (
        "archive",
        "lastSuccessfulBackup",
        "lastSuccessfulBackupID",
        "firstRecoverabilityPoint",
        "nextScheduledBackup",
    )
    return {
        "url": store.destination_path if store is not None else None,
        "following": spec.replica.enabled,
        **{k: status[k] for k in keys if k in status},
    }


def _archive_lines(archive: Mapping[str, Any], now: datetime.datetime) -> list[str]:
    state = archive.get("archive") or {}
    how = "following" if archive["following"] else "archiving to"
    line = f"Archive:      {how} {archive['url']}"
    if state:
        line += f", lsn {state.get('lastArchivedLSN')}, {state.get('lagSeconds')} s behind"
        line += ", FAILING" if state.get("failing") else ""
    last = archive.get("lastSuccessfulBackup")
    backups = (
        f"last {_ago(last, now)} ({archive.get('lastSuccessfulBackupID')})" if last else "none yet"
    )
    if archive.get("firstRecoverabilityPoint"):
        backups += f", recoverable from {archive['firstRecoverabilityPoint']}"
    if archive.get("nextScheduledBackup"):
        backups += f", next {archive['nextScheduledBackup']}"
    return [line, f"Backups:      {backups}"]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Columns padded to their widest cell, as ``kubectl get`` prints them."""
    cells = [list(header), *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def _ago(stamp: str, now: datetime.datetime) -> str:
    when = _parse(stamp)
    if when is None:
        return stamp
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{stamp} ({seconds // size}{unit} ago)"
    return f"{stamp} ({seconds}s ago)"


def render(report: Mapping[str, Any], now: datetime.datetime | None = None) -> str:
    """The report as a person reads it: a summary, then one row per pod."""
    now = now or datetime.datetime.now(datetime.UTC)
    out = [
        f"DurableStream {report['namespace']}/{report['name']}: {report['phase']}, "
        f"{report['readyReplicas']}/{report['replicas']} servers ready",
        f"Endpoint:     {report['endpoint'] or '-'}",
    ]
    if report["replicas"] > 1:
        out += _replica_set_lines(report, now)
    else:
        out.append("Replicas:     one server (not a replica set: no Lease, no standbys)")
    if report.get("archive"):
        out += _archive_lines(report["archive"], now)
    if report["annotations"]:
        notes = ", ".join(f"{k}={v}" for k, v in sorted(report["annotations"].items()))
        out.append(f"Annotations:  {notes}")
    if report["conditions"]:
        out.append("Conditions not as expected:")
        out += [
            f"  {c['type']}={c['status']} {c['reason']}: {c['message']}"
            for c in report["conditions"]
        ]
    else:
        out.append("Conditions:   all as expected")
    out.append("")
    out += _pod_table(report["pods"])
    return "\n".join(out) + "\n"


def _replica_set_lines(report: Mapping[str, Any], now: datetime.datetime) -> list[str]:
    """A replica set's primary, its Lease and the last change of primary."""
    out = []
    if report.get("primary"):
        began = f", began by {report['termBegan']}" if report.get("termBegan") else ""
        out.append(
            f"Primary:      {report['primary']} (term {report['term']}{began}), "
            f"{report.get('inSyncReplicas') or 0} in sync"
        )
    else:
        out.append("Primary:      none elected yet")
    out.append(_lease_line(report.get("lease")))
    change = report.get("lastPrimaryChange")
    if change:
        out.append(
            f"Last change:  {change['reason']} ({change['type']}) "
            f"{_ago(change['time'], now)}: {change['message']}"
        )
    else:
        out.append("Last change:  no change of primary recorded (Events expire after 1 h)")
    return out


def _lease_line(lease: Mapping[str, Any] | None) -> str:
    if lease is None:
        return "Lease:        none yet"
    if "error" in lease:
        return f"Lease:        not read ({lease['error']})"
    began = f", began by {lease['termBegan']}" if lease["termBegan"] else ""
    renewed = f", renewed {lease['renewTime']}" if lease.get("renewTime") else ""
    return (
        f"Lease:        {lease['name']} held by {lease['holder'] or 'nobody'}, "
        f"term {lease['term']}{began}; in sync: {', '.join(lease['inSync']) or 'none'}"
        f"{renewed}"
    )


def _pod_table(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per pod; the servers' own answers (``--live``) in four more columns."""
    header = ["POD", "ROLE", "READY", "IN-SYNC", "POSITION", "LAG-BATCHES", "RESTARTS", "FENCED"]
    live = any("live" in r for r in pods)
    if live:
        header += ["LIVE-ROLE", "LIVE-POSITION", "LIVE-LAG", "PROBLEM"]
    rows = []
    for r in pods:
        row = [
            r["pod"] + (" (no pod)" if r.get("missing") else ""),
            r["role"],
            r["ready"],
            r["inSync"],
            r["position"],
            r["lagBatches"],
            r["restarts"],
            r["fenced"],
        ]
        if live:
            got = r.get("live") or {}
            if "error" in got:
                row += ["-", "-", "-", got["error"]]
            else:
                row += [
                    got.get("role"),
                    got.get("durable"),
                    got.get("lagBatches"),
                    got.get("problem"),
                ]
        rows.append(row)
    return table(header, rows)
