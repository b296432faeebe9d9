"""What a setting's value may be: one small check per kind of value, and the checks
that look at several settings together.

A check returns None for a good value, else what is wrong in words that follow
the setting's flag ("must be 0 to 65535"); ``config/declaration.py`` names the setting
(flag and variable) around them, so that every refusal at start says which
setting to change. The bounds are where the parts below stop working: a port
is 16 bits (the socket layer keeps the low 16 bits of a larger number, so
70000 listened on 4464), a thread's wait overflows past ``threading.TIMEOUT_MAX``,
the engine's sizes and offsets are signed 64-bit on the way to ``pread`` and
LMDB, and NaN compares false with everything (a NaN webhook timeout made every
delivery time out at once, in silence).
"""

from __future__ import annotations

import math
import os
import resource
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

Check = Callable[[Any], "str | None"]

INT_MAX = 2**63 - 1  # a signed 64-bit integer: file offsets, LMDB sizes, the engine's counters
MAX_SECONDS = threading.TIMEOUT_MAX  # the longest timeout a lock or a thread accepts (292 years)
MAX_TTL = 2**53 - 1  # the longest Stream-TTL a request may ask for (protocol/headers.py)
MAX_PORT = 65535
LMDB_MAP_MIN = 64 * 1024
# LMDB reserves its whole map as address space, and x86-64 gives a process 2**47
# bytes of it: past 2**46 the map cannot even be doubled once when it fills.
LMDB_MAP_MAX = 2**46
INT32_MAX = 2**31 - 1  # a Lease's leaseDurationSeconds is an int32
# Settings whose value is memory held per request or connection, bounded where a larger
# one would let clients take the machine's memory rather than serve a real need:
# a request body is read whole into memory before it is appended (and the CRD's
# maxBodyBytes stops at the same 1 GiB), and a request's head is held whole while it
# arrives, on every connection at once (1 MiB is Go's net/http default).
MAX_BODY_BYTES = 1024**3
MAX_HEADER_BYTES = 1024**2
# Worker processes per CPU the process may run on. Each is a process of about 70 MiB
# (docs/kubernetes.md, "Sizing a pod") and past one per CPU more only share the same
# cores; a few per CPU still let a one-CPU machine run the tests' two workers. 1000
# forked until the machine ran out of memory.
WORKERS_PER_CPU = 4


def whole(low: int, high: int = INT_MAX) -> Check:
    """An integer from ``low`` to ``high``."""

    def check(value: int) -> str | None:
        if low <= value <= high:
            return None
        if high == INT_MAX:
            if value > high:
                return f"must be at most {high}"
            return "must not be negative" if low == 0 else f"must be at least {low}"
        return f"must be {low} to {high}"

    return check


def seconds(*, positive: bool = True, high: float = MAX_SECONDS) -> Check:
    """A finite duration: positive (or, with ``positive=False``, not negative)."""

    def check(value: float) -> str | None:
        if not math.isfinite(value):
            return "must be a finite number of seconds"
        if positive and value <= 0:
            return "must be positive"
        if value < 0:
            return "must not be negative"
        if value > high:
            return f"must be at most {high:g} seconds"
        return None

    return check


def rate(value: float) -> str | None:
    """Requests per second: finite and not negative (0: off)."""
    if not math.isfinite(value) or value < 0:
        return "must be a finite number, not negative"
    return None


def one_of(*choices: str, any_case: bool = False) -> Check:
    def check(value: str) -> str | None:
        if (value.lower() if any_case else value) in choices:
            return None
        return "must be " + ", ".join(f"'{c}'" for c in choices[:-1]) + f" or '{choices[-1]}'"

    return check


def not_empty(value: str) -> str | None:
    return "must not be empty" if not value.strip() else None


def http_url(value: str) -> str | None:
    """Empty, or an http(s) URL with a host (a path is kept; no query or fragment)."""
    if not value:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not one
    except ValueError as exc:
        return f"{value!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{value!r} must be an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return f"{value!r} must have no query or fragment"
    return None


def s3_url(value: str) -> str | None:
    """Empty, or s3://BUCKET/PREFIX (the archive's location)."""
    if not value:
        return None
    # Imported here: the format package needs zlib-ng, and the command line must
    # reach its "install the server extra" message without it (tests/packaging).
    from stream_format.archive import ArchiveLocation

    try:
        ArchiveLocation.parse(value)
    except ValueError as exc:
        return str(exc)
    return None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_backup_retention(value: str) -> tuple[float | None, int | None]:
    """``--backup-retention``: (seconds to keep backups, or None; how many newest to
    keep, or None); ("", both None): keep every backup. ValueError saying what it takes."""
    text = value.strip()
    if not text:
        return None, None
    if text.startswith("last="):
        n = text[5:]
        if n.isdigit() and int(n) >= 1:
            return None, int(n)
    elif len(text) > 1 and text[:-1].isdigit() and text[-1] in _UNITS and int(text[:-1]) > 0:
        return float(int(text[:-1]) * _UNITS[text[-1]]), None
    raise ValueError(
        f"{value!r} is not a backup retention: a duration (12h, 7d, 4w) or last=N (N >= 1)"
    )


def backup_retention(value: str) -> str | None:
    try:
        parse_backup_retention(value)
    except ValueError as exc:
        return str(exc)
    return None


def archive_follow(follow: bool, url: str, lease: str) -> str | None:
    """A replica cluster's server follows an archive, and each of its pods alone."""
    if not follow:
        return None
    if not url:
        return "archive-follow needs --archive-url: the archive to follow"
    if lease:
        return (
            "archive-follow with --replication-lease: each server of a replica cluster "
            "follows the archive on its own, without a replica set's Lease"
        )
    return None


def readable_file(value: str) -> str | None:
    """Empty, or a file this process can read now (not only when it is first needed)."""
    if not value:
        return None
    try:
        with Path(value).open("rb") as f:
            f.read(1)
    except OSError as exc:
        return f"{value!r} cannot be read: {exc.strerror or exc}"
    return None


def ca_bundle(value: str) -> str | None:
    """Empty, or a readable PEM bundle holding at least one certificate."""
    problem = readable_file(value)
    if problem is not None or not value:
        return problem
    try:
        ssl.create_default_context(cafile=value)
    except ssl.SSLError as exc:
        return f"{value!r} holds no PEM certificate: {exc}"
    return None


def tls_pair(cert: str, key: str) -> str | None:
    """The server's certificate and key: both or neither."""
    if bool(cert) != bool(key):
        return "--tls-cert and --tls-key go together"
    return None


def tls_loads(cert: str, key: str) -> str | None:
    """The server's certificate and key load as a matching pair (or neither is set)."""
    if not cert or not key:
        return None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        return f"--tls-cert and --tls-key do not load as a certificate and its key: {exc}"
    return None


def allowed_cpus() -> int:
    """The CPUs this process may run on (its affinity), at least one: what bounds
    ``--workers``. A pod's CPU quota is not counted here: it limits time, not the
    processes a machine can hold (``workers/supervisor.py`` counts it for the default)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def workers_here(value: int) -> str | None:
    """At most ``WORKERS_PER_CPU`` worker processes per CPU this process may use."""
    cpus = allowed_cpus()
    most = WORKERS_PER_CPU * cpus
    if value <= most:
        return None
    return (
        f"must be at most {most} here ({WORKERS_PER_CPU} per CPU this process may use, "
        f"{cpus}): each worker is a process of its own, about 70 MiB, and more than the "
        "CPUs only share the same cores"
    )


def connections_here(value: int) -> str | None:
    """At most the process's hard open-file limit: each connection is a descriptor, and
    past the limit new ones fail to be accepted (EMFILE) while they wait in the backlog."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or value <= hard:
        return None
    return f"must be at most {hard} here, the process's open-file limit (each is a descriptor)"


def data_directory(value: Path) -> str | None:
    """A directory, or a name in a directory that exists (it is made at start, without
    parents: a mistyped parent must not grow a tree somewhere unexpected)."""
    path = Path(value)
    if path.exists():
        if not path.is_dir():
            return "is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable by this user"
        return None
    parent = path.absolute().parent
    if not parent.is_dir():
        return f"cannot be made: its parent {str(parent)!r} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be made: its parent {str(parent)!r} is not writable by this user"
    return None


def local_address(value: str) -> str | None:
    """A host name or address this machine can listen on: it resolves, and a socket binds
    to it (on a port the kernel picks, so the port's own check is the listen's). ``::``
    is every interface, IPv6 and IPv4, and IPv4's alone on a machine without IPv6
    (``listen.py``): always one of this machine's."""
    if value == "::":
        return None
    try:
        found = socket.getaddrinfo(value, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return f"is not an address: {getattr(exc, 'strerror', None) or exc}"
    problem = ""
    for family, kind, proto, _, address in found:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((address[0], 0, *address[2:]))
        except OSError as exc:
            problem = exc.strerror or str(exc)
            continue
        return None
    return f"is not an address of this machine: {problem}"


# Checks that look at this machine (its files, CPUs, limits and addresses), not at the
# value alone: made when the server starts (``config.settings_from``), not by every
# ``Settings`` a test or a tool makes for another machine (the operator renders paths
# inside a pod, for a node it does not run on).
ON_DISK: frozenset[Check] = frozenset(
    {readable_file, ca_bundle, workers_here, connections_here, data_directory, local_address}
)
