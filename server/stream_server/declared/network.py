"""The settings of the HTTP front: where clients reach the server, what one client or
request may hold, and what is logged and measured; the protocol's handlers read
them all (``ProtocolSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from stream_server.declared import checks
from stream_server.declared.about import Group, setting
from stream_server.declared.groups import COUNT, FILE, NONE_OR_MORE, SECONDS, SECONDS_OR_ZERO

DEFAULT_PORT = 4437  # the protocol's registered port
NETWORK, LIMITS, OBSERVE = Group.NETWORK, Group.LIMITS, Group.LOGS_AND_METRICS


@dataclass
class NetworkSettings:
    """Where and how clients reach the server."""

    host: str = setting(
        "127.0.0.1",
        NETWORK,
        "interface to listen on (:: in a pod: IPv6 and IPv4 on one socket, 0.0.0.0 where IPv6 is off)",
        checks.not_empty,
        checks.local_address,
    )
    port: int = setting(
        DEFAULT_PORT,
        NETWORK,
        "TCP port (the protocol's default is 4437; 0: any free port)",
        checks.whole(0, checks.MAX_PORT),
    )
    base_path: str = setting("/v1/stream/", NETWORK, "URL prefix under which streams are served")
    workers: int = setting(
        0,
        NETWORK,
        "processes serving HTTP on the port (0: one per CPU the process may use, from its "
        "cgroup quota or affinity; 1: one process, no hand-off); past 1 the main process "
        "only writes (WAL, LMDB, group commit, replication) and the workers parse requests "
        f"and hand it their writes; at most {checks.WORKERS_PER_CPU} per CPU the process may "
        "run on (docs/workers.md)",
        NONE_OR_MORE,
        checks.workers_here,
    )
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


@dataclass
class LimitsSettings:
    """What one client or request may hold; past them the answer says so."""

    max_connections: int = setting(
        0,
        LIMITS,
        "most open client connections; more are closed at once (0: derived from the open-file "
        "limit; at most that limit)",
        NONE_OR_MORE,
        checks.connections_here,
    )
    max_body_bytes: int = setting(
        64 * 1024 * 1024,
        LIMITS,
        "largest request body accepted (larger: 413); at most 1 GiB, as a body is held in "
        "memory whole",
        checks.whole(1, checks.MAX_BODY_BYTES),
        unit="bytes",
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
        65536,
        LIMITS,
        "largest total size of request headers (larger: 431); at most 1 MiB, as each "
        "connection holds its head in memory",
        checks.whole(1, checks.MAX_HEADER_BYTES),
        unit="bytes",
    )
    max_headers: int = setting(100, LIMITS, "most request headers (more: 431)", COUNT)
    max_json_messages: int = setting(
        100_000, LIMITS, "most messages one JSON-mode request may carry (more: 413)", COUNT
    )
    max_streams: int = setting(
        0, LIMITS, "most streams the server holds (0: unlimited; more: 503)", NONE_OR_MORE
    )
    hot_streams: int = setting(
        4096,
        LIMITS,
        "streams kept loaded in memory; past it the least recently used idle ones are dropped "
        "and loaded again from disk when next asked for",
        COUNT,
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


@dataclass
class LogsSettings:
    """Logs and metrics."""

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


@dataclass
class ProtocolSettings(NetworkSettings, LimitsSettings, LogsSettings):
    """What the protocol's handlers read (``protocol/context.py``): the three groups."""
