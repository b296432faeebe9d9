"""The public port, bound by the server itself before it serves: a port in use or an
address that is not this machine's stops the start at once, naming the setting.

Uvicorn binds only after the app's start-up has begun, and then logged its error, ran
the app's shutdown ("stopped cleanly") and exited 3; a writer of workers waited
10 s for any port in use. Binding here, before the app starts, refuses the start
with ``CannotListen`` (exit status 2, like every other refusal of a setting).

``--host ::`` listens on every interface, IPv6 and IPv4 alike: one IPv6 socket with
``IPV6_V6ONLY`` off, whatever the machine's default (``net.ipv6.bindv6only``), so a pod
is reached at its IPv6 and its IPv4 addresses, as a dual-stack cluster gives it both.
A machine without IPv6 (a kernel started with ``ipv6.disable=1``: no IPv6 socket can
be made) listens on 0.0.0.0 instead, and says so: the same setting serves every
cluster, single-stack or dual.

The only wait is for what this program left behind itself: a writer killed -9 leaves
its workers holding the port until they see their link close (a few seconds at
most), and its runtime directory, which names the port in ``PORT_FILE``. A start on
that port waits for them; any other holder stops the start at once.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stream_server.config import SettingError

BACKLOG = 2048  # uvicorn's default
RUNTIME_PREFIX = "ds-writer-"  # a writer's runtime directory: ds-writer-<pid>-<random>
PORT_FILE = "port"  # in a writer's runtime directory: the port its workers serve
BIND_PATIENCE = 10.0  # seconds a start waits for a port a killed writer's workers still hold
RETRY = 0.2  # seconds between two binds while they do
ANY = "::"  # every interface, IPv6 and IPv4 (module doc)
ANY_IPV4 = "0.0.0.0"  # what ANY falls back to on a machine without IPv6
# What making or binding an IPv6 socket answers on a machine without IPv6.
NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL})

# The address is not this machine's, or of a family it does not have: --host's fault.
HOST_ERRORS = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})

log = logging.getLogger("stream_server")

SocketMaker = Callable[[int, int], socket.socket]


class CannotListen(SettingError):
    """The port or the address cannot be listened on; the message names the setting."""


def listen_socket(
    host: str, port: int, tmp: Path | None = None, *, make: SocketMaker = socket.socket
) -> socket.socket:
    """A listening socket on ``host``:``port``, or ``CannotListen`` naming ``--port``
    (in use, or not allowed) or ``--host`` (not an address of this machine). ``ANY``:
    IPv6 and IPv4 on one socket, or IPv4 alone where there is no IPv6 (module doc).
    ``make``: how a socket of a family is made (the kernel's, but for a test playing
    a machine without IPv6)."""
    if host != ANY:
        return _listen(make, host, port, tmp)
    try:
        return _listen(make, host, port, tmp)
    except _NoIpv6 as exc:
        log.warning(
            "--host %s: this machine has no IPv6 (%s); listening on %s, IPv4 only",
            ANY,
            exc.cause.strerror or exc.cause,
            ANY_IPV4,
        )
        return _listen(make, ANY_IPV4, port, tmp)


class _NoIpv6(Exception):
    """An IPv6 socket for ``ANY`` could not be made or bound: no IPv6 here."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _listen(make: SocketMaker, host: str, port: int, tmp: Path | None) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = make(family, socket.SOCK_STREAM)
    except OSError as exc:
        if host == ANY and exc.errno in NO_IPV6:
            raise _NoIpv6(exc) from None
        raise cannot_listen(host, port, exc) from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if host == ANY:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
    deadline: float | None = None
    while True:
        try:
            sock.bind((host, port))
            break
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                if deadline is None and orphans_hold(port, tmp or Path(tempfile.gettempdir())):
                    deadline = time.monotonic() + BIND_PATIENCE
                if deadline is not None and time.monotonic() < deadline:
                    time.sleep(RETRY)
                    continue
            sock.close()
            if host == ANY and exc.errno in NO_IPV6:
                raise _NoIpv6(exc) from None
            raise cannot_listen(host, port, exc) from None
    sock.listen(BACKLOG)  # inherited by the workers only (``pass_fds``), not across an exec
    return sock


def cannot_listen(host: str, port: int, exc: OSError) -> CannotListen:
    """The refusal, naming the setting to change: the host where the address is not
    this machine's (or not a name that resolves), else the port."""
    what = f"cannot listen on {host} port {port}: {exc.strerror or exc}"
    if exc.errno in HOST_ERRORS or isinstance(exc, socket.gaierror):
        return CannotListen(f"--host {host}: {what} (env DS_HOST)")
    return CannotListen(f"--port {port}: {what} (env DS_PORT)")


def stale_runtimes(tmp: Path) -> list[tuple[int, Path]]:
    """The runtime directories of writers that no longer run (killed -9: their sockets
    and the workers' metrics files stay behind), with the writer's pid. One named by
    this pid is an earlier image of this process (one restarted in place: a re-copy
    installed, a fence), which stopped its workers before it did."""
    found = []
    for d in tmp.glob(f"{RUNTIME_PREFIX}*-*"):
        pid = d.name[len(RUNTIME_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not _runs(int(pid))):
            found.append((int(pid), d))
    return found


def orphans_hold(port: int, tmp: Path) -> bool:
    """Whether a writer killed -9 served ``port``: its workers may hold it still."""
    for pid, d in stale_runtimes(tmp):
        if pid == os.getpid():
            continue  # this process's earlier image stopped its workers
        try:
            if int((d / PORT_FILE).read_text()) == port:
                return True
        except (OSError, ValueError):
            continue
    return False


def remove_stale_runtimes(tmp: Path) -> None:
    """Remove the runtime directories of writers that no longer run: called once this
    writer has its port (the directories said who might hold it) and before it makes
    its own."""
    for _, stale in stale_runtimes(tmp):
        shutil.rmtree(stale, ignore_errors=True)


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
