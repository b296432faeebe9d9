"""The object-store parts of a DurableStream's spec, as CloudNativePG shapes them:
``spec.backup`` (the continuous archive and base backups), ``spec.bootstrap.recovery``
(a new DurableStream made from an archive) and ``spec.replica`` (a read-only set that
follows another set's archive). Typed frozen views, parsed by ``spec.with_defaults``,
and the operator's own check of what the CRD's schema and CEL rules refuse.

An object store is the same shape wherever it appears (CloudNativePG's
``barmanObjectStore``): ``destinationPath`` (``s3://BUCKET/PREFIX``), ``endpointURL``
(any S3-compatible store), ``s3Credentials`` (Secret key selectors for the access key
id, the secret access key and, optionally, the region; left out, the pod's own
credentials, e.g. an IAM role for its service account) and ``endpointCA`` (a Secret
key holding the PEM bundle the store's certificate is checked against).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stream_operator.api import cron

DESTINATION = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")
# The server's --backup-retention: a duration (keep younger backups, and always the
# newest) or ``last=N`` (the newest N).
RETENTION = re.compile(r"^([1-9][0-9]*[hd]|last=[1-9][0-9]*)$")
ARCHIVE_MODES = ("async", "required")
BACKUP_TARGETS = ("prefer-standby", "primary")


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret in the DurableStream's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: SecretKey
    secret_access_key: SecretKey
    region: SecretKey | None


@dataclass(frozen=True)
class ObjectStore:
    """Where an archive lives and how to reach it."""

    destination_path: str  # s3://BUCKET/PREFIX
    endpoint_url: str | None  # None: AWS S3
    credentials: S3Credentials | None  # None: the pod's own (IAM role, IRSA)
    endpoint_ca: SecretKey | None  # None: the system's CAs


@dataclass(frozen=True)
class BackupSpec:
    """``spec.backup``: this set's own archive, its backups' schedule and retention."""

    object_store: ObjectStore
    archive_timeout_seconds: float | None  # None: the server's own (10 s)
    archive_mode: str | None  # async | required; None: the server's own (async)
    retention_policy: str | None  # 30d, 12h, last=7; None: keep every backup
    schedule: str | None  # cron, 5 or 6 fields; None: on demand only
    target: str  # prefer-standby | primary: where scheduled backups are taken


@dataclass(frozen=True)
class RecoveryTarget:
    target_time: str | None  # RFC 3339
    target_lsn: int | None


@dataclass(frozen=True)
class RecoverySpec:
    """``spec.bootstrap.recovery``: the first pod's volume is restored from ``source``."""

    source: ObjectStore
    backup_id: str | None  # None: the newest backup that reaches the target
    target: RecoveryTarget


@dataclass(frozen=True)
class ReplicaSpec:
    """``spec.replica``: follow ``source``'s archive as a read-only set while enabled.
    ``demotion_policy``: what becomes of a set's own volumes when it is demoted
    (replica_cluster.py); not a default of the spec, so no existing hash changes."""

    enabled: bool
    source: ObjectStore | None
    demotion_policy: str = "Refuse"  # Refuse | Rebuild


def _secret_key(raw: Mapping[str, Any] | None) -> SecretKey | None:
    if not raw:
        return None
    return SecretKey(name=str(raw.get("name") or ""), key=str(raw.get("key") or ""))


def object_store(raw: Mapping[str, Any] | None) -> ObjectStore | None:
    """An object store as given (None: none given)."""
    if not raw:
        return None
    creds = raw.get("s3Credentials") or None
    credentials = None
    if creds:
        access, secret = (
            _secret_key(creds.get("accessKeyId")),
            _secret_key(creds.get("secretAccessKey")),
        )
        credentials = S3Credentials(
            access_key_id=access or SecretKey("", ""),
            secret_access_key=secret or SecretKey("", ""),
            region=_secret_key(creds.get("region")),
        )
    return ObjectStore(
        destination_path=str(raw.get("destinationPath") or ""),
        endpoint_url=str(raw["endpointURL"]) if raw.get("endpointURL") else None,
        credentials=credentials,
        endpoint_ca=_secret_key(raw.get("endpointCA")),
    )


def backup(raw: Mapping[str, Any] | None) -> BackupSpec | None:
    """``spec.backup`` (None: no archive)."""
    store = object_store((raw or {}).get("objectStore"))
    if raw is None or store is None:
        return None
    timeout = raw.get("archiveTimeout")
    return BackupSpec(
        object_store=store,
        archive_timeout_seconds=None if timeout is None else float(timeout),
        archive_mode=str(raw["archiveMode"]) if raw.get("archiveMode") else None,
        retention_policy=str(raw["retentionPolicy"]) if raw.get("retentionPolicy") else None,
        schedule=str(raw["schedule"]) if raw.get("schedule") else None,
        target=str(raw.get("target") or "prefer-standby"),
    )


def recovery(raw: Mapping[str, Any] | None) -> RecoverySpec | None:
    """``spec.bootstrap.recovery`` (None: a new set starts empty)."""
    rec = (raw or {}).get("recovery") or None
    source = object_store((rec or {}).get("source"))
    if rec is None or source is None:
        return None
    target = rec.get("recoveryTarget") or {}
    lsn = target.get("targetLSN")
    return RecoverySpec(
        source=source,
        backup_id=str(rec["backupID"]) if rec.get("backupID") else None,
        target=RecoveryTarget(
            target_time=str(target["targetTime"]) if target.get("targetTime") else None,
            target_lsn=None if lsn is None else int(lsn),
        ),
    )


def replica(raw: Mapping[str, Any] | None) -> ReplicaSpec:
    """``spec.replica`` (disabled when left out)."""
    raw = raw or {}
    return ReplicaSpec(
        enabled=bool(raw.get("enabled")),
        source=object_store(raw.get("source")),
        demotion_policy=str(raw.get("demotionPolicy") or "Refuse"),
    )


def _refused_store(where: str, store: ObjectStore) -> str | None:
    if not DESTINATION.match(store.destination_path):
        return (
            f"{where}.destinationPath must be s3://BUCKET[/PREFIX], not {store.destination_path!r}"
        )
    if store.endpoint_url and not re.match(r"^https?://", store.endpoint_url):
        return f"{where}.endpointURL must be an http(s) URL, not {store.endpoint_url!r}"
    creds = store.credentials
    if creds is not None:
        for field, sel in (
            ("accessKeyId", creds.access_key_id),
            ("secretAccessKey", creds.secret_access_key),
        ):
            if not (sel.name and sel.key):
                return f"{where}.s3Credentials.{field} needs a Secret name and key"
    return None


def refused_archive(
    backup_spec: BackupSpec | None, rec: RecoverySpec | None, rep: ReplicaSpec
) -> str | None:
    """What the CRD's schema and rules refuse in ``backup``, ``bootstrap`` and ``replica``,
    for a cluster that did not run them (the server would refuse to start, or a
    schedule would never fire)."""
    if backup_spec is not None and (why := _refused_backup(backup_spec)):
        return why
    if rec is not None:
        why = _refused_store("bootstrap.recovery.source", rec.source) or _refused_target(rec)
        if why:
            return why
    if rep.enabled and rep.source is None:
        return "replica.enabled needs replica.source: the archive to follow"
    if rep.source is not None:
        return _refused_store("replica.source", rep.source)
    return None


def _refused_backup(b: BackupSpec) -> str | None:
    if why := _refused_store("backup.objectStore", b.object_store):
        return why
    if b.archive_mode not in (None, *ARCHIVE_MODES):
        return "backup.archiveMode must be async or required"
    if b.retention_policy and not RETENTION.match(b.retention_policy):
        return f"backup.retentionPolicy must be like 30d, 12h or last=7, not {b.retention_policy!r}"
    if b.schedule and (why := cron.refused(b.schedule)):
        return f"backup.schedule: {why}"
    if b.archive_timeout_seconds is not None and b.archive_timeout_seconds <= 0:
        return "backup.archiveTimeout must be more than 0 seconds"
    if b.target not in BACKUP_TARGETS:
        return "backup.target must be prefer-standby or primary"
    return None


def _refused_target(rec: RecoverySpec) -> str | None:
    t = rec.target
    if t.target_time and t.target_lsn is not None:
        return "bootstrap.recovery.recoveryTarget: give targetTime or targetLSN, not both"
    if t.target_lsn is not None and t.target_lsn < 1:
        return "bootstrap.recovery.recoveryTarget.targetLSN must be 1 or more"
    if t.target_time:
        try:
            when = datetime.datetime.fromisoformat(t.target_time.replace("Z", "+00:00"))
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            return (
                "bootstrap.recovery.recoveryTarget.targetTime must be RFC 3339 with a zone, "
                f"not {t.target_time!r}"
            )
    return None
