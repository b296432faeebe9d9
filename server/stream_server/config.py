"""Settings from command-line flags and environment variables (flags win).

Every setting has a ``DS_*`` environment variable so that containers and the
operator can configure the server without building a command line.
"""

from __future__ import annotations

import argparse
import difflib
import os
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_PORT = 4437  # the protocol's registered port


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: Path = Path("./data")
    base_path: str = "/v1/stream/"
    long_poll_timeout: float = 30.0
    sse_reconnect_interval: float = 60.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_read_bytes: int = 64 * 1024 * 1024
    max_path_bytes: int = 1024
    default_ttl: int = 0
    log_level: str = "info"
    log_format: str = "plain"
    slow_append_seconds: float = 1.0
    lmdb_map_size: int = 8 * 1024**3
    metrics: bool = True
    auth_tokens_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    rate_limit: float = 0.0
    rate_burst: int = 100
    max_streams: int = 0
    max_live_readers: int = 10000
    body_timeout: float = 30.0
    max_header_bytes: int = 65536
    max_headers: int = 100
    header_timeout: float = 10.0
    keep_alive_timeout: float = 30.0
    min_body_rate: int = 1024
    max_connections: int = 0
    max_live_readers_per_client: int = 0
    max_json_messages: int = 100_000
    max_producers_per_stream: int = 1000
    max_fork_depth: int = 64
    reload_interval: float = 5.0
    webhook_allow: list[str] = field(default_factory=list)
    webhook_timeout: float = 10.0
    webhook_key_replay_window: float = 24 * 3600.0
    webhook_key_rotation_interval: float = 0.0
    webhook_ca_file: str = ""
    public_url: str = ""
    max_subscriptions: int = 10_000
    retention: list[str] = field(default_factory=list)
    replication_lease: str = ""
    replica_name: str = ""
    replica_url: str = ""
    replication_pod: str = ""
    kube_api: str = ""
    replication_set_size: int = 1
    min_in_sync: int = 0
    replication_durability: str = "required"
    lease_duration: float = 15.0
    lease_renew_deadline: float = 10.0
    lease_retry_period: float = 2.0
    replication_wait: float = 5.0
    replication_token_file: str = ""
    replication_ca_file: str = ""
    replication_cert_file: str = ""
    replication_key_file: str = ""
    replication_bootstrap: str = ""
    replication_read_staleness: float = 5.0
    fence_file: str = ""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not self.base_path.startswith("/"):
            self.base_path = "/" + self.base_path
        if not self.base_path.endswith("/"):
            self.base_path += "/"
        if self.log_format not in ("plain", "json"):
            raise ValueError("log format must be 'plain' or 'json'")
        for name in (
            "long_poll_timeout",
            "sse_reconnect_interval",
            "body_timeout",
            "header_timeout",
            "keep_alive_timeout",
            "reload_interval",
            "webhook_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.replace('_', '-')} must be positive")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        for name in (
            "max_body_bytes",
            "max_read_bytes",
            "max_path_bytes",
            "rate_burst",
            "max_header_bytes",
            "max_headers",
            "max_json_messages",
            "max_producers_per_stream",
            "max_fork_depth",
            "max_subscriptions",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        for name in (
            "min_body_rate",
            "max_connections",
            "max_live_readers_per_client",
            "webhook_key_replay_window",
            "webhook_key_rotation_interval",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must not be negative")
        from stream_server.subscriptions.urls import WebhookAllowList

        WebhookAllowList.from_settings(self.webhook_allow)  # a typo fails here, at start
        from stream_server.streams.retention import parse_policies

        parse_policies(self.retention)  # so does a bad retention rule
        from stream_server.replication.settings import check_settings

        check_settings(self)  # and a replica set's settings that cannot work together


HELP = {
    "host": "interface to listen on (0.0.0.0 in a pod)",
    "port": "TCP port (the protocol's default is 4437)",
    "data_dir": "data directory: LMDB metadata, WAL and segment files",
    "base_path": "URL prefix under which streams are served",
    "long_poll_timeout": "seconds a long-poll read waits for data before 204",
    "sse_reconnect_interval": "seconds after which an SSE response is closed (clients reconnect)",
    "max_body_bytes": "largest request body accepted (larger: 413)",
    "max_read_bytes": "largest catch-up response (binary streams; sent in 4 MiB chunks as "
    "they are read; JSON responses stop at 4 MiB)",
    "max_path_bytes": "longest stream path accepted (longer: 400)",
    "default_ttl": "TTL in seconds for streams created without TTL or expiry (0: none)",
    "log_level": "debug, info, warning or error",
    "log_format": "plain or json (one object per line)",
    "slow_append_seconds": "appends slower than this are logged with their time split",
    "lmdb_map_size": "initial LMDB map size in bytes (grown when full)",
    "metrics": "serve Prometheus metrics on /metrics (true/false)",
    "auth_tokens_file": "JSON file of bearer tokens with scopes and path prefixes (empty: no auth)",
    "tls_cert": "TLS certificate file (PEM); with --tls-key, serve HTTPS",
    "tls_key": "TLS private key file (PEM)",
    "rate_limit": "requests per second allowed per client or token (0: unlimited)",
    "rate_burst": "requests a client may send at once before the rate applies",
    "max_streams": "most streams the server holds (0: unlimited; more: 503)",
    "max_live_readers": "most concurrent long-poll and SSE readers (more: 503)",
    "body_timeout": "seconds a request body may stall before the request fails (408), "
    "and a slow body's grace (see --min-body-rate)",
    "max_header_bytes": "largest total size of request headers (larger: 431)",
    "max_headers": "most request headers (more: 431)",
    "header_timeout": "seconds from a request's first byte until its headers are complete "
    "(slower: 408, and the connection is closed)",
    "keep_alive_timeout": "seconds an idle connection (no request in progress) stays open",
    "min_body_rate": "bytes/s a request body must average: it may take --body-timeout plus "
    "a second per this many bytes received (slower: 408; 0: only the stall timeout)",
    "max_connections": "most open client connections; more are closed at once "
    "(0: derived from the open-file limit)",
    "max_live_readers_per_client": "most live readers one client (address, or token with auth) "
    "may hold (0: a tenth of --max-live-readers; more: 503)",
    "max_json_messages": "most messages one JSON-mode request may carry (more: 413)",
    "max_producers_per_stream": "idempotent producers remembered per stream; past it the "
    "least recently active one is forgotten",
    "max_fork_depth": "longest chain of forks below a root stream (deeper: 400)",
    "webhook_allow": "CIDR or host name (*.suffix for a domain) that webhooks may target "
    "although private, e.g. 10.0.0.0/8 or receiver.ns.svc; repeat the flag, or comma-separate "
    "in the variable; listed hosts may also use http://",
    "webhook_timeout": "seconds one webhook delivery may take in all (DNS, connect, response)",
    "webhook_key_replay_window": "seconds a rotated-out webhook signing key stays in the JWKS",
    "webhook_key_rotation_interval": "seconds after which the server makes a new webhook "
    "signing key (0: only by `durable-streams-server rotate-webhook-key`)",
    "webhook_ca_file": "PEM bundle of CAs to trust for https:// webhooks (empty: the public CAs)",
    "public_url": "the server's URL as webhook receivers reach it, e.g. https://streams.example "
    "(callback and JWKS URLs; empty: the scheme and Host of the request that created the "
    "subscription)",
    "max_subscriptions": "most subscriptions the server holds (more: 503)",
    "retention": "PREFIX:RULES dropping old data of the streams under PREFIX (relative to the "
    "base path; longest prefix wins), RULES comma-separated max-bytes=SIZE (512KiB, 10MiB, "
    "10GiB) and max-age=DURATION (30s, 15m, 12h, 7d), e.g. 'logs/:max-bytes=10GiB,max-age=7d'; "
    "repeat the flag",
    "replication_lease": "NAMESPACE/NAME of the coordination.k8s.io/v1 Lease that elects the "
    "primary of a replica set (empty: single-node mode, no peers)",
    "replica_name": "this replica's identity in the Lease (empty: the host name)",
    "replica_url": "origin that peers and clients reach this server at, e.g. http://ds-0.ds:4437 "
    "(required with --replication-lease)",
    "replication_pod": "this replica's Pod (its namespace is the Lease's), which it labels "
    "with its role; as primary it also labels the set's other pods and sets their in-sync "
    "readiness-gate condition; must equal --replica-name (empty: label no pod)",
    "kube_api": "Kubernetes API URL for the Lease (empty: the in-cluster service account)",
    "replication_set_size": "N, the number of replicas in the set (1 to 5)",
    "min_in_sync": "replicas, the primary included, that must hold a batch before it is "
    "acknowledged (0: a majority of the set)",
    "replication_durability": "required (too few in sync: 503) or preferred (acknowledge on the "
    "primary alone then, shown as degraded)",
    "lease_duration": "seconds a Lease holder stays primary without renewing",
    "lease_renew_deadline": "seconds after the last renewal at which a primary stops "
    "acknowledging (less than --lease-duration)",
    "lease_retry_period": "seconds between two attempts to renew or acquire the Lease",
    "replication_wait": "seconds a write waits for enough in-sync replicas before 503",
    "replication_token_file": "file holding the replica set's shared secret: fetch, snapshot "
    "and switchover then require it as a bearer token (empty: no peer authentication)",
    "replication_ca_file": "PEM bundle of CAs that peers' certificates (https replica URLs) are "
    "checked against, instead of the system's CAs (empty: the system's CAs)",
    "replication_cert_file": "client certificate (PEM) this replica presents to its peers, "
    "for mutual TLS; with --replication-key-file (empty: none)",
    "replication_key_file": "private key (PEM, unencrypted) of --replication-cert-file",
    "replication_bootstrap": "the replica name that may start a new replica set from empty "
    "storage (a replica holding data may always; empty: any replica may), e.g. ds-0",
    "replication_read_staleness": "seconds a replica's reads may lag the primary's "
    "acknowledged writes: a replica that cannot show it is current within this refuses reads "
    "with 503 (more than twice the commit-point heartbeat)",
    "fence_file": "file of the pod's annotations (a downward API volume): while it holds "
    'streams.pyds.dev/fenced="true" the server is fenced: process up, storage closed and '
    "untouched, /readyz and every request 503 (checked every second; empty: never fenced)",
    "reload_interval": "seconds between checks of the TLS certificate, key and token file for "
    "a change, which is then loaded without a restart (SIGHUP: check now)",
}


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        env = "DS_" + f.name.upper()
        if _is_list(f):
            parser.add_argument(
                flag,
                dest=f.name,
                default=None,
                action="append",
                help=f"{HELP[f.name]} [env {env}, {_SEPARATOR_NAMES[_separator(f.name)]}-"
                "separated; default none]",
            )
            continue
        parser.add_argument(
            flag,
            dest=f.name,
            default=None,
            help=f"{HELP[f.name]} [env {env}; default {f.default}]",
        )


def _is_list(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is list


# List settings whose items hold commas themselves (retention rules) are separated by
# ";" in their variable; a flag given several times gives one item each time.
_SEPARATORS = {"retention": ";"}
_SEPARATOR_NAMES = {",": "comma", ";": "semicolon"}


def _separator(name: str) -> str:
    return _SEPARATORS.get(name, ",")


def _split_list(raw: str | list[str], sep: str = ",") -> list[str]:
    items = [raw] if isinstance(raw, str) else raw
    return [part.strip() for item in items for part in item.split(sep) if part.strip()]


# DS_* variables that are not settings: fault injection for the crash tests.
NOT_SETTINGS = frozenset({"DS_FAULT"})
# DS_* prefixes another program owns: the operator's settings, which a shell or
# a test runner may export next to the server's.
NOT_SETTINGS_PREFIXES = ("DS_OPERATOR_",)


def env_names() -> dict[str, str]:
    """Every setting's environment variable, mapped to its field name."""
    return {"DS_" + f.name.upper(): f.name for f in fields(Settings)}


def check_environment(environ: dict[str, str]) -> None:
    """Refuse a ``DS_*`` variable that names no setting: a typo would otherwise be
    ignored in silence, and the server would run with a default the user did not want."""
    known = env_names()
    for name in sorted(environ):
        if (
            name.startswith("DS_")
            and name not in known
            and name not in NOT_SETTINGS
            and not name.startswith(NOT_SETTINGS_PREFIXES)
        ):
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(
                f"unknown setting {name}{hint}; `durable-streams-server serve --help` lists them"
            )


def settings_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    """Build settings: flag, else ``DS_<NAME>`` from the environment, else default."""
    environ = dict(os.environ) if environ is None else environ
    check_environment(environ)
    values = {}
    for f in fields(Settings):
        raw = getattr(args, f.name, None)
        if raw is None:
            raw = environ.get("DS_" + f.name.upper())
        if raw is None:
            continue
        if _is_list(f):
            values[f.name] = _split_list(raw, _separator(f.name))
            continue
        kind = type(f.default)
        try:
            values[f.name] = _parse_bool(raw) if kind is bool else kind(raw)
        except ValueError:
            raise ValueError(f"invalid value {raw!r} for {f.name.replace('_', '-')}") from None
    return Settings(**values)
