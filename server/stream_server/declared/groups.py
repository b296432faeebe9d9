"""The settings of one concern each, declared once: the part that reads a group
receives it as it is (the server's ``Settings`` inherits every group, so that it is
one), and no class restates a field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stream_server.declared import checks
from stream_server.declared.about import Group, setting, setting_list

COUNT = checks.whole(1)
NONE_OR_MORE = checks.whole(0)
SECONDS = checks.seconds()
SECONDS_OR_ZERO = checks.seconds(positive=False)
FILE = checks.readable_file
STORAGE, REPL, ARCHIVE = Group.STORAGE, Group.REPLICATION, Group.ARCHIVE


@dataclass
class SubscriptionSettings:
    """Webhooks that wake consumers when streams change (``subscriptions/``)."""

    public_url: str = setting(
        "",
        Group.SUBSCRIPTIONS,
        "the server's URL as webhook receivers reach it, e.g. https://streams.example (callback "
        "and JWKS URLs; empty: the scheme and Host of the request that created the subscription)",
        checks.http_url,
    )
    max_subscriptions: int = setting(
        10_000, Group.SUBSCRIPTIONS, "most subscriptions the server holds (more: 503)", COUNT
    )
    webhook_allow: list[str] = setting_list(  # noqa: RUF009 - a field(default_factory=list)
        Group.SUBSCRIPTIONS,
        "CIDR or host name (*.suffix for a domain) that webhooks may target although private, e.g."
        " 10.0.0.0/8 or receiver.ns.svc; repeat the flag; listed hosts may also use http://",
    )
    webhook_timeout: float = setting(
        10.0,
        Group.SUBSCRIPTIONS,
        "seconds one webhook delivery may take in all (DNS, connect, response)",
        SECONDS,
        unit="s",
    )
    webhook_ca_file: str = setting(
        "",
        Group.SUBSCRIPTIONS,
        "PEM bundle of CAs to trust for https:// webhooks (empty: the public CAs)",
        checks.ca_bundle,
    )
    webhook_key_replay_window: float = setting(
        24 * 3600.0,
        Group.SUBSCRIPTIONS,
        "seconds a rotated-out webhook signing key stays in the JWKS",
        SECONDS_OR_ZERO,
        unit="s",
    )
    webhook_key_rotation_interval: float = setting(
        0.0,
        Group.SUBSCRIPTIONS,
        "seconds after which the server makes a new webhook signing key (0: only by "
        "`durable-streams-server rotate-webhook-key`)",
        SECONDS_OR_ZERO,
        unit="s",
    )


@dataclass
class StorageSettings:
    """The data directory and what the engine keeps in it."""

    data_dir: Path = setting(  # noqa: RUF009 - a field(), as every setting()
        Path("./data"),
        STORAGE,
        "data directory: LMDB metadata, WAL and segment files (made at start if missing; its "
        "parent must exist)",
        checks.data_directory,
    )
    lmdb_map_size: int = setting(
        8 * 1024**3,
        STORAGE,
        "initial LMDB map size in bytes (doubled when full)",
        checks.whole(checks.LMDB_MAP_MIN, checks.LMDB_MAP_MAX),
        unit="bytes",
    )
    checkpoint_frames: int = setting(
        10_000,
        STORAGE,
        "WAL frames (batches) after which a checkpoint starts, as one does past 64 MiB of WAL: "
        "recovery after a kill -9 replays at most about this many",
        COUNT,
    )
    checkpoint_interval: float = setting(
        60.0,
        STORAGE,
        "seconds after which a WAL frame is checkpointed, with or without writes since",
        SECONDS,
        unit="s",
    )
    fence_file: str = setting(
        "",
        STORAGE,
        "file of the pod's annotations (a downward API volume): while it holds "
        'streams.pyds.dev/fenced="true" the server is fenced: process up, storage closed and '
        "untouched, /readyz and every request 503 (a missing file: not fenced; empty: never "
        "fenced)",
    )


@dataclass
class ReplicationSettings(StorageSettings):
    """A replica set of one primary and standbys (docs/replication.md); its data
    directory holds the set's id, checked before the engine opens."""

    replication_lease: str = setting(
        "",
        REPL,
        "NAMESPACE/NAME of the coordination.k8s.io/v1 Lease that elects the primary of a replica "
        "set (empty: single-node mode, no peers)",
    )
    replica_name: str = setting(
        "", REPL, "this replica's identity in the Lease (empty: the host name)"
    )
    replica_url: str = setting(
        "",
        REPL,
        "origin that peers and clients reach this server at, e.g. http://ds-0.ds:4437 (required "
        "with --replication-lease)",
        checks.http_url,
    )
    replication_pod: str = setting(
        "",
        REPL,
        "this replica's Pod (its namespace is the Lease's), which it labels with its role; as "
        "primary it also labels the set's other pods and sets their in-sync readiness-gate "
        "condition; must equal --replica-name (empty: label no pod)",
    )
    kube_api: str = setting(
        "",
        REPL,
        "Kubernetes API URL for the Lease (empty: the in-cluster service account)",
        checks.http_url,
    )
    replication_set_size: int = setting(
        1, REPL, "N, the number of replicas in the set (1 to 5)", checks.whole(1, 5)
    )
    min_in_sync: int = setting(
        0,
        REPL,
        "replicas, the primary included, that must hold a batch before it is acknowledged (0: a "
        "majority of the set)",
        checks.whole(0, 5),
    )
    replication_durability: str = setting(
        "required",
        REPL,
        "required (too few in sync: 503) or preferred (acknowledge on the primary alone then, "
        "shown as degraded)",
        checks.one_of("required", "preferred"),
    )
    lease_duration: float = setting(
        15.0,
        REPL,
        "seconds a Lease holder stays primary without renewing",
        checks.seconds(high=checks.INT32_MAX),
        unit="s",
    )
    lease_renew_deadline: float = setting(
        10.0,
        REPL,
        "seconds after the last renewal at which a primary stops acknowledging (less than "
        "--lease-duration)",
        SECONDS,
        unit="s",
    )
    lease_retry_period: float = setting(
        2.0, REPL, "seconds between two attempts to renew or acquire the Lease", SECONDS, unit="s"
    )
    replication_wait: float = setting(
        5.0,
        REPL,
        "seconds a write waits for enough in-sync replicas before 503",
        SECONDS_OR_ZERO,
        unit="s",
    )
    replication_read_staleness: float = setting(
        5.0,
        REPL,
        "seconds a replica's reads may lag the primary's acknowledged writes: a replica that "
        "cannot show it is current within this refuses reads with 503 (more than twice the "
        "commit-point heartbeat)",
        SECONDS,
        unit="s",
    )
    replication_token_file: str = setting(
        "",
        REPL,
        "file holding the replica set's shared secret: fetch, snapshot and switchover then require"
        " it as a bearer token (empty: no peer authentication)",
        FILE,
    )
    replication_ca_file: str = setting(
        "",
        REPL,
        "PEM bundle of CAs that peers' certificates (https replica URLs) are checked against, "
        "instead of the system's CAs (empty: the system's CAs)",
        FILE,
    )
    replication_cert_file: str = setting(
        "",
        REPL,
        "client certificate (PEM) this replica presents to its peers, for mutual TLS; with "
        "--replication-key-file (empty: none)",
        FILE,
    )
    replication_key_file: str = setting(
        "", REPL, "private key (PEM, unencrypted) of --replication-cert-file", FILE
    )
    replication_bootstrap: str = setting(
        "",
        REPL,
        "the replica name that may start a new replica set from empty storage (a replica holding "
        "data may always; empty: any replica may), e.g. ds-0",
    )


@dataclass
class ArchiveSettings:
    """The WAL and base backups in an S3-compatible object store (docs/backup.md)."""

    archive_url: str = setting(
        "",
        ARCHIVE,
        "s3://BUCKET/PREFIX the primary archives every WAL frame to and base backups go to "
        "(empty: no archive); credentials and region as the AWS SDKs read them "
        "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, a shared credentials file)",
        checks.s3_url,
    )
    archive_endpoint: str = setting(
        "",
        ARCHIVE,
        "URL of an S3-compatible object store, e.g. http://seaweedfs:8333 (empty: AWS S3)",
        checks.http_url,
    )
    archive_region: str = setting(
        "", ARCHIVE, "the object store's region (empty: AWS_REGION, else us-east-1)"
    )
    archive_ca_bundle: str = setting(
        "",
        ARCHIVE,
        "PEM bundle of CAs the object store's certificate is checked against (empty: the "
        "system's CAs)",
        FILE,
    )
    archive_timeout: float = setting(
        10.0,
        ARCHIVE,
        "seconds after which a frame waiting for the archive is uploaded whatever the batch's "
        "size: the recovery point objective of a restore from the archive",
        SECONDS,
        unit="s",
    )
    archive_mode: str = setting(
        "async",
        ARCHIVE,
        "async (acknowledge once durable here and on the standbys; the archive follows within "
        "--archive-timeout) or required (acknowledge only once the archive holds the write too)",
        checks.one_of("async", "required"),
    )
    archive_object_bytes: int = setting(
        16 * 1024 * 1024,
        ARCHIVE,
        "bytes of WAL frames gathered into one archive object before it is uploaded",
        checks.whole(4096, 5 * 1024**3),
        unit="bytes",
    )
    archive_max_pending_bytes: int = setting(
        1024**3,
        ARCHIVE,
        "bytes of WAL kept on local disk for an archive that lags; beyond them new writes get "
        "503 with Retry-After until the archive catches up (nothing leaves the archive unseen)",
        checks.whole(1024 * 1024),
        unit="bytes",
    )
    backup_retention: str = setting(
        "",
        ARCHIVE,
        "base backups kept after each backup: a duration (7d, 12h: backups younger than it, "
        "and always the newest) or last=N; older ones go, with the archived WAL no kept backup "
        "needs (empty: keep all)",
        checks.backup_retention,
    )
    archive_follow: bool = setting(
        False,
        ARCHIVE,
        "follow the archive at --archive-url read-only (a replica cluster): restore its newest "
        "base backup into an empty data directory, apply its frames as they appear, serve "
        "reads and refuse writes; archives nothing (true/false)",
    )
