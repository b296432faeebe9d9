"""A DurableStream's archive in its status round: the primary's archive state, the
``ContinuousArchiving`` condition, Events when archiving starts failing and when it
recovers, and the backups ``spec.backup.schedule`` makes when they fall due.

The archive's state comes from ``GET /_archive/status`` on the primary (the only pod
that archives; a replica cluster's pods follow), with a short timeout: a primary that
does not answer leaves the last figures as they were and the condition Unknown.
Figures are rounded (lag to whole seconds) so that a status is not rewritten for a
difference nobody reads.

A schedule is kept in the status as the next time due (``nextScheduledBackup``) and the
schedule it was computed from: a round at or after that time creates a
DurableStreamBackup named for it (so two rounds, or two operators, make one), then
moves on to the next time after now. Missed times while the operator was down make
one backup, not one each (as CloudNativePG's ScheduledBackup).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from stream_operator.api import cron
from stream_operator.api.conditions import condition
from stream_operator.api.spec import DurableStreamSpec
from stream_operator.controllers.archive_pods import access, primary_pod
from stream_operator.controllers.backups import create_backup, render_backup
from stream_operator.decisions.replica_roles import LeaseView
from stream_operator.kube import archive_call, events

CONDITION = "ContinuousArchiving"
_KINDS = {
    "unavailable": "ArchiveUnavailable",
    "denied": "ArchiveDenied",
    "damaged": "ArchiveDamaged",
}


def _stamp(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(raw: Any) -> datetime.datetime | None:
    try:
        when = datetime.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def archive_fields(reply: archive_call.Reply) -> dict[str, Any]:
    """``status.archive`` from the server's answer."""
    b = reply.body
    fields: dict[str, Any] = {
        "lastArchivedLSN": int(b.get("archived_lsn") or 0),
        "lagSeconds": round(float(b.get("lag_seconds") or 0.0)),
        "failing": bool(b.get("failing")),
        "role": str(b.get("role") or ""),
    }
    if b.get("last_archived_at"):
        fields["lastArchivedAt"] = str(b["last_archived_at"])
    if b.get("failing") and b.get("last_error"):
        fields["lastError"] = str(b["last_error"])[:500]
    return fields


def archiving_condition(
    reply: archive_call.Reply | None, pod: str, following: bool
) -> dict[str, str]:
    """The ContinuousArchiving condition from the primary's answer (None: no primary)."""
    if reply is None:
        return {
            **condition(CONDITION, False, "NoPrimary", "no primary to archive"),
            "status": "Unknown",
        }
    if not reply.ok:
        message = f"{pod} did not report its archive: {reply.why}"
        return {**condition(CONDITION, False, "NoArchiveStatus", message), "status": "Unknown"}
    b = reply.body
    if b.get("failing"):
        reason = _KINDS.get(str(b.get("last_error_kind")), "ArchiveFailing")
        return condition(CONDITION, False, reason, str(b.get("last_error") or "archiving fails"))
    lag = float(b.get("lag_seconds") or 0.0)
    lsn = int(b.get("archived_lsn") or 0)
    if following:
        return condition(
            CONDITION,
            True,
            "FollowingSource",
            f"applied up to lsn {lsn}, {lag:.0f} s behind the source",
        )
    return condition(CONDITION, True, "Archiving", f"archived up to lsn {lsn}, {lag:.0f} s behind")


def observe(
    ac: client.ApiClient,
    ds: Mapping[str, Any],
    spec: DurableStreamSpec,
    view: LeaseView,
    now: datetime.datetime | None = None,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The archive's status fields and condition (none without an archive)."""
    if spec.backup is None and not spec.replica.enabled:
        return {}, []
    now = now or datetime.datetime.now(datetime.UTC)
    previous = dict(ds.get("status") or {})
    fields = schedule(ac, ds, spec, previous, now)
    pod = primary_pod(ds["metadata"]["name"], spec.replicated, view)
    if not pod and spec.replica.enabled:
        # A replica cluster's pods all follow the archive; the first one answers for them.
        pod = f"{ds['metadata']['name']}-0"
    reply = None
    if pod:
        how = access(ac, ds, spec, pod)
        reply = archive_call.archive_status(how.origin, how.token, verify=how.verify)
    cond = archiving_condition(reply, pod, spec.replica.enabled)
    if reply is not None and reply.ok:
        fields["archive"] = archive_fields(reply)
    _tell(ds, previous, cond)
    return fields, [cond]


def _tell(ds: Mapping[str, Any], previous: Mapping[str, Any], cond: Mapping[str, str]) -> None:
    """A Warning when archiving starts failing, a Normal Event when it recovers."""
    before = next((c for c in previous.get("conditions") or [] if c.get("type") == CONDITION), None)
    failing = cond["status"] == "False"
    was_failing = before is not None and before.get("status") == "False"
    if failing and not was_failing:
        events.warn(ds, reason="ArchiveFailing", message=f"{cond['reason']}: {cond['message']}")
    elif was_failing and cond["status"] == "True":
        events.info(ds, reason="ArchiveRecovered", message=cond["message"])


def schedule(
    ac: client.ApiClient,
    ds: Mapping[str, Any],
    spec: DurableStreamSpec,
    previous: Mapping[str, Any],
    now: datetime.datetime,
) -> dict[str, Any]:
    """The schedule's status fields; the backup that fell due created."""
    expr = spec.backup.schedule if spec.backup is not None and not spec.replica.enabled else None
    if not expr or cron.refused(expr):
        return {}
    sched = cron.parse(expr)
    due = _parse(previous.get("nextScheduledBackup"))
    fields: dict[str, Any] = {"backupSchedule": expr}
    if due is None or previous.get("backupSchedule") != expr:
        fields["nextScheduledBackup"] = _stamp(sched.next_after(now))
        return fields
    if now < due:
        fields["nextScheduledBackup"] = _stamp(due)
        fields["lastScheduledBackup"] = previous.get("lastScheduledBackup")
        return {k: v for k, v in fields.items() if v is not None}
    meta = ds["metadata"]
    name = f"{meta['name']}-{due.strftime('%Y%m%d%H%M%S')}"
    assert spec.backup is not None
    if create_backup(
        ac, render_backup(meta["name"], meta["namespace"], meta["uid"], name, spec.backup.target)
    ):
        events.info(ds, reason="BackupScheduled", message=f"created DurableStreamBackup {name}")
    fields["lastScheduledBackup"] = _stamp(due)
    fields["nextScheduledBackup"] = _stamp(sched.next_after(now))
    return fields
