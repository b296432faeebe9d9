"""Settings: each one declared once, here, and everything else derived from it.

A setting is a field of ``Settings`` made by ``setting()``: its default, its
group (the concern it belongs to), its help text, its unit and the checks its
value must pass. From that one declaration come the command-line flag
(``--long-poll-timeout``), the environment variable (``DS_LONG_POLL_TIMEOUT``;
flags win), the validation at start (a refusal names the flag and the
variable), ``serve --help`` and the README's table (``python -m stream_server
settings --markdown``; a test keeps the README equal to it). The operator's
defaults and the CRD are checked against these defaults by a test too.

The layers take what they need by name from a ``Settings`` (``app.py`` wires
them), and keep no defaults of their own for it. A new concern (the object
store archive is next) is a new ``Group`` and its fields, nothing more.

Every value is checked when a ``Settings`` is made, and the files the settings
name when the server starts (``settings_from``: a ``Settings`` made for another
machine, as the operator's tests make one, names files that are not here), so
the server stops with exit status 2 before it opens its data directory or a
socket, not later when a value is first used (``setting_checks.py`` says where
each bound comes from).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import Field, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from stream_server import setting_checks as checks

T = TypeVar("T")

DEFAULT_PORT = 4437  # the protocol's registered port


class Group(Enum):
    """The concerns settings are grouped by, in the order --help and the README show them."""

    NETWORK = "Network"
    LIMITS = "Limits"
    STORAGE = "Storage"
    LOGS_AND_METRICS = "Logs and metrics"
    SUBSCRIPTIONS = "Subscriptions (webhooks)"
    RETENTION = "Retention"
    REPLICATION = "Replication"


@dataclass(frozen=True)
class About:
    """Everything about one setting but its name, type and default."""

    group: Group
    help: str
    checks: tuple[checks.Check, ...] = ()
    unit: str = ""  # "bytes" or "s": how the README shows the default
    separator: str = ","  # list settings: what separates items in the variable


def setting(default: T, group: Group, help: str, *check: checks.Check, unit: str = "") -> T:
    """A field of ``Settings``: typed as its default, described by ``About``."""
    about = About(group, help, check, unit)
    return field(default=default, metadata={"about": about})


def setting_list(group: Group, help: str, *check: checks.Check, separator: str = ",") -> list[str]:
    """A setting given any number of times (each flag one item; the variable separated)."""
    about = About(group, help, check, separator=separator)
    return field(default_factory=list[str], metadata={"about": about})


NETWORK, LIMITS, STORAGE = Group.NETWORK, Group.LIMITS, Group.STORAGE
OBSERVE, SUBS, RETAIN, REPL = (
    Group.LOGS_AND_METRICS,
    Group.SUBSCRIPTIONS,
    Group.RETENTION,
    Group.REPLICATION,
)
COUNT = checks.whole(1)
NONE_OR_MORE = checks.whole(0)
SECONDS = checks.seconds()
SECONDS_OR_ZERO = checks.seconds(positive=False)
FILE = checks.readable_file


@dataclass
class Settings:
    # -- Network: where and how clients reach the server.
    host: str = setting(
        "127.0.0.1", NETWORK, "interface to listen on (0.0.0.0 in a pod)", checks.not_empty
    )
    port: int = setting(
        DEFAULT_PORT,
        NETWORK,
        "TCP port (the protocol's default is 4437; 0: any free port)",
        checks.whole(0, checks.MAX_PORT),
    )
    base_path: str = setting("/v1/stream/", NETWORK, "URL prefix under which streams are served")
    tls_cert: str = setting(
        "", NETWORK, "TLS certificate file (PEM); with --tls-key, serve HTTPS", FILE
    )
    tls_key: str = setting("", NETWORK, "TLS private key file (PEM)", FILE)
    auth_tokens_file: str = setting(
        "",
        NETWORK,
        "JSON file of bearer tokens with scopes and path prefixes (empty: no auth)",
        FILE,
    )
    reload_interval: float = setting(
        5.0,
        NETWORK,
        "seconds between checks of the TLS certificate, key and token file for a change, which is "
        "then loaded without a restart (SIGHUP: check now)",
        SECONDS,
        unit="s",
    )
    keep_alive_timeout: float = setting(
        30.0,
        NETWORK,
        "seconds an idle connection (no request in progress) stays open",
        SECONDS,
        unit="s",
    )
    header_timeout: float = setting(
        10.0,
        NETWORK,
        "seconds from a request's first byte until its headers are complete (slower: 408, and the "
        "connection is closed)",
        SECONDS,
        unit="s",
    )
    body_timeout: float = setting(
        30.0,
        NETWORK,
        "seconds a request body may stall before the request fails (408), and a slow body's grace "
        "(see --min-body-rate)",
        SECONDS,
        unit="s",
    )
    min_body_rate: int = setting(
        1024,
        NETWORK,
        "bytes/s a request body must average: it may take --body-timeout plus a second per this "
        "many bytes received (slower: 408; 0: only the stall timeout)",
        NONE_OR_MORE,
    )
    long_poll_timeout: float = setting(
        30.0, NETWORK, "seconds a long-poll read waits for data before 204", SECONDS, unit="s"
    )
    sse_reconnect_interval: float = setting(
        60.0,
        NETWORK,
        "seconds after which an SSE response is closed (clients reconnect)",
        SECONDS,
        unit="s",
    )

    # -- Limits: what one client or request may hold; past them the answer says so.
    max_connections: int = setting(
        0,
        LIMITS,
        "most open client connections; more are closed at once (0: derived from the open-file "
        "limit)",
        NONE_OR_MORE,
    )
    max_body_bytes: int = setting(
        64 * 1024 * 1024, LIMITS, "largest request body accepted (larger: 413)", COUNT, unit="bytes"
    )
    max_read_bytes: int = setting(
        64 * 1024 * 1024,
        LIMITS,
        "largest catch-up response (binary streams; sent in 4 MiB chunks as they are read; JSON "
        "responses stop at 4 MiB)",
        COUNT,
        unit="bytes",
    )
    max_path_bytes: int = setting(
        1024,
        LIMITS,
        "longest stream path accepted, percent-encoded (longer: 400)",
        COUNT,
        unit="bytes",
    )
    max_header_bytes: int = setting(
        65536, LIMITS, "largest total size of request headers (larger: 431)", COUNT, unit="bytes"
    )
    max_headers: int = setting(100, LIMITS, "most request headers (more: 431)", COUNT)
    max_json_messages: int = setting(
        100_000, LIMITS, "most messages one JSON-mode request may carry (more: 413)", COUNT
    )
    max_streams: int = setting(
        0, LIMITS, "most streams the server holds (0: unlimited; more: 503)", NONE_OR_MORE
    )
    max_producers_per_stream: int = setting(
        1000,
        LIMITS,
        "idempotent producers remembered per stream; past it the least recently active one is "
        "forgotten",
        COUNT,
    )
    max_fork_depth: int = setting(
        64, LIMITS, "longest chain of forks below a root stream (deeper: 400)", COUNT
    )
    max_live_readers: int = setting(
        10000, LIMITS, "most concurrent long-poll and SSE readers (more: 503)", NONE_OR_MORE
    )
    max_live_readers_per_client: int = setting(
        0,
        LIMITS,
        "most live readers one client (address, or token with auth) may hold (0: a tenth of "
        "--max-live-readers; more: 429)",
        NONE_OR_MORE,
    )
    rate_limit: float = setting(
        0.0,
        LIMITS,
        "requests per second allowed per client or token (0: unlimited; more: 429)",
        checks.rate,
    )
    rate_burst: int = setting(
        100, LIMITS, "requests a client may send at once before the rate applies", COUNT
    )
    default_ttl: int = setting(
        0,
        LIMITS,
        "TTL in seconds for streams created without TTL or expiry (0: none)",
        checks.whole(0, checks.MAX_TTL),
        unit="s",
    )

    # -- Storage: the data directory and what the engine keeps in it.
    data_dir: Path = setting(  # noqa: RUF009 - a field(), as every setting()
        Path("./data"), STORAGE, "data directory: LMDB metadata, WAL and segment files"
    )
    lmdb_map_size: int = setting(
        8 * 1024**3,
        STORAGE,
        "initial LMDB map size in bytes (doubled when full)",
        checks.whole(checks.LMDB_MAP_MIN, checks.LMDB_MAP_MAX),
        unit="bytes",
    )
    fence_file: str = setting(
        "",
        STORAGE,
        "file of the pod's annotations (a downward API volume): while it holds "
        'streams.pyds.dev/fenced="true" the server is fenced: process up, storage closed and '
        "untouched, /readyz and every request 503 (a missing file: not fenced; empty: never "
        "fenced)",
    )

    # -- Logs and metrics.
    log_level: str = setting(
        "info",
        OBSERVE,
        "debug, info, warning or error",
        checks.one_of("debug", "info", "warning", "error", "critical", any_case=True),
    )
    log_format: str = setting(
        "plain", OBSERVE, "plain or json (one object per line)", checks.one_of("plain", "json")
    )
    slow_append_seconds: float = setting(
        1.0,
        OBSERVE,
        "appends slower than this are logged with their time split",
        SECONDS_OR_ZERO,
        unit="s",
    )
    metrics: bool = setting(True, OBSERVE, "serve Prometheus metrics on /metrics (true/false)")

    # -- Subscriptions: webhooks that wake consumers when streams change.
    public_url: str = setting(
        "",
        SUBS,
        "the server's URL as webhook receivers reach it, e.g. https://streams.example (callback "
        "and JWKS URLs; empty: the scheme and Host of the request that created the subscription)",
        checks.http_url,
    )
    max_subscriptions: int = setting(
        10_000, SUBS, "most subscriptions the server holds (more: 503)", COUNT
    )
    webhook_allow: list[str] = setting_list(  # noqa: RUF009 - a field(default_factory=list)
        SUBS,
        "CIDR or host name (*.suffix for a domain) that webhooks may target although private, e.g."
        " 10.0.0.0/8 or receiver.ns.svc; repeat the flag; listed hosts may also use http://",
    )
    webhook_timeout: float = setting(
        10.0,
        SUBS,
        "seconds one webhook delivery may take in all (DNS, connect, response)",
        SECONDS,
        unit="s",
    )
    webhook_ca_file: str = setting(
        "",
        SUBS,
        "PEM bundle of CAs to trust for https:// webhooks (empty: the public CAs)",
        checks.ca_bundle,
    )
    webhook_key_replay_window: float = setting(
        24 * 3600.0,
        SUBS,
        "seconds a rotated-out webhook signing key stays in the JWKS",
        SECONDS_OR_ZERO,
        unit="s",
    )
    webhook_key_rotation_interval: float = setting(
        0.0,
        SUBS,
        "seconds after which the server makes a new webhook signing key (0: only by "
        "`durable-streams-server rotate-webhook-key`)",
        SECONDS_OR_ZERO,
        unit="s",
    )

    # -- Retention: bounded disk for streams that run forever (docs/retention.md).
    retention: list[str] = setting_list(  # noqa: RUF009 - a field(default_factory=list)
        RETAIN,
        "PREFIX:RULES dropping old data of the streams under PREFIX (relative to the base path; "
        "longest prefix wins), RULES comma-separated max-bytes=SIZE (512KiB, 10MiB, 10GiB) and "
        "max-age=DURATION (30s, 15m, 12h, 7d), e.g. 'logs/:max-bytes=10GiB,max-age=7d'; repeat the"
        " flag",
        separator=";",
    )

    # -- Replication: a replica set of one primary and standbys (docs/replication.md).
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

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not self.base_path.startswith("/"):
            self.base_path = "/" + self.base_path
        if not self.base_path.endswith("/"):
            self.base_path += "/"
        validate(self)


# --- What is derived from the declaration -------------------------------------------------


@dataclass(frozen=True)
class Described:
    """One setting as the CLI, the environment and the docs see it."""

    name: str
    default: Any
    about: About

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "DS_" + self.name.upper()

    @property
    def is_list(self) -> bool:
        return isinstance(self.default, list)


def described() -> Iterator[Described]:
    """Every setting, in declaration order (grouped by concern)."""
    for f in fields(Settings):
        yield Described(f.name, _default(f), f.metadata["about"])


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default


class SettingError(ValueError):
    """A value a setting may not have; the message names the flag and the variable."""


def validate(s: Settings) -> None:
    """Every setting's own checks, then the ones that look at several together; not
    the files they name (``check_on_disk``)."""
    _each(s, lambda check: check not in checks.ON_DISK)
    for problem in _together(s):
        if problem is not None:
            raise SettingError(name_settings(problem))


def check_on_disk(s: Settings) -> None:
    """The files the settings name: there, readable, and holding what they should."""
    _each(s, lambda check: check in checks.ON_DISK)
    problem = checks.tls_loads(s.tls_cert, s.tls_key)
    if problem is not None:
        raise SettingError(name_settings(problem))


def _each(s: Settings, which: Callable[[checks.Check], bool]) -> None:
    for d in described():
        value = getattr(s, d.name)
        for check in filter(which, d.about.checks):
            problem = check(value)
            if problem is not None:
                raise SettingError(f"{d.flag} {problem} (env {d.env}; given {value!r})")


def _together(s: Settings) -> Iterator[str | None]:
    """The checks across settings, or that need another layer's parser (imported here,
    so that importing the settings imports no layer); the first that fails stops the rest."""
    from stream_server.replication.settings import check_settings
    from stream_server.subscriptions.urls import WebhookAllowList

    yield checks.tls_pair(s.tls_cert, s.tls_key)
    yield checks.retention_rules(s.retention, s.max_path_bytes)
    yield _refusal(lambda: WebhookAllowList.from_settings(s.webhook_allow), "webhook-allow: ")
    yield _refusal(lambda: check_settings(s))


def _refusal(check: Callable[[], object], prefix: str = "") -> str | None:
    try:
        check()
    except ValueError as exc:
        return prefix + str(exc)
    return None


_WORD = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def name_settings(message: str) -> str:
    """``message`` (from a check that names settings by their flag, without the dashes)
    with the first setting it names given as a flag, and their variables added."""
    known = {d.flag[2:]: d for d in described()}
    # Single words ("host", "port") are settings only first: elsewhere they are English.
    found = _WORD.findall(message)
    words = [w for i, w in enumerate(found) if w in known and ("-" in w or i == 0)]
    if not words:
        return message
    if message.startswith(words[0]):
        message = "--" + message
    envs = ", ".join(dict.fromkeys(known[w].env for w in words))
    return f"{message} (env {envs})"


# --- Flags and variables --------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] = ()) -> None:
    """A flag per setting (``only``: just these), in groups, each saying its variable and
    default. Flags default to None, so that ``settings_from`` can tell one given."""
    groups: dict[Group, argparse._ArgumentGroup] = {}
    for d in described():
        if only and d.name not in only:
            continue
        if d.about.group not in groups:
            groups[d.about.group] = parser.add_argument_group(d.about.group.value)
        target = groups[d.about.group]
        if d.is_list:
            sep = "semicolon" if d.about.separator == ";" else "comma"
            target.add_argument(
                d.flag,
                dest=d.name,
                action="append",
                help=f"{d.about.help} [env {d.env}, {sep}-separated; default none]",
            )
        else:
            target.add_argument(
                d.flag,
                dest=d.name,
                metavar=_metavar(d),
                help=f"{d.about.help} [env {d.env}; default {d.default}]",
            )


def _metavar(d: Described) -> str:
    """What the flag takes, in a word: BYTES, SECONDS, N, ... (else the setting's name)."""
    by_unit = {"bytes": "BYTES", "s": "SECONDS"}
    by_type = {bool: "BOOL", int: "N", float: "NUMBER"}
    return by_unit.get(d.about.unit) or by_type.get(type(d.default)) or d.name.upper()


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


_PARSERS: dict[type, Callable[[str], Any]] = {
    bool: _parse_bool,
    int: int,
    float: float,
    str: str,
}


def _split_list(raw: str | list[str], sep: str = ",") -> list[str]:
    items = [raw] if isinstance(raw, str) else raw
    return [part.strip() for item in items for part in item.split(sep) if part.strip()]


def parse_value(d: Described, raw: str | list[str]) -> Any:
    """A flag's or a variable's text as the setting's type; SettingError naming it."""
    if d.is_list:
        return _split_list(raw, d.about.separator)
    assert isinstance(raw, str)
    parse = _PARSERS.get(type(d.default), Path)
    try:
        return parse(raw)
    except ValueError:
        kind = {bool: "true or false", int: "a whole number", float: "a number"}
        expected = kind.get(type(d.default), "a value")
        raise SettingError(f"{d.flag} must be {expected} (env {d.env}; given {raw!r})") from None


# DS_* variables that are not settings: fault injection for the crash tests.
NOT_SETTINGS = frozenset({"DS_FAULT"})
# DS_* prefixes another program owns: the operator's settings, which a shell or
# a test runner may export next to the server's.
NOT_SETTINGS_PREFIXES = ("DS_OPERATOR_",)


def env_names() -> dict[str, str]:
    """Every setting's environment variable, mapped to its field name."""
    return {d.env: d.name for d in described()}


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
            raise SettingError(
                f"unknown setting {name}{hint}; `durable-streams-server serve --help` lists them"
            )


def values_from(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, Any]:
    """Each setting given, by flag or else by ``DS_<NAME>``, as its type (unchecked)."""
    check_environment(environ)
    values: dict[str, Any] = {}
    for d in described():
        raw = getattr(args, d.name, None)
        if raw is None:
            raw = environ.get(d.env)
        if raw is not None:
            values[d.name] = parse_value(d, raw)
    return values


def settings_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    """The settings to start with: flag, else ``DS_<NAME>`` from the environment, else
    default; every value checked, and the files named (SettingError naming the setting)."""
    settings = Settings(**values_from(args, dict(os.environ) if environ is None else environ))
    check_on_disk(settings)
    return settings
