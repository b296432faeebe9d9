"""The pod's service-account credentials for the server's Kubernetes API clients, re-read
as client-go re-reads them.

The kubelet rotates a pod's projected token (hourly where the API server issues
short-lived tokens) by swapping the files of the mounted volume, and the CA bundle
can change the same way. A client that read them once at start gets 401 on every
call once the old token expires: the Lease is no longer renewed and the replica set
stops taking writes while ``/healthz`` stays 200. So the token and the CA are taken
from the files at each request when the files changed (one ``stat`` each, on the
kubelet's tmpfs), and a 401 makes the token be read again and the request sent once
more before the failure is reported (the token may have been swapped between the
``stat`` and the API server's check, or the ``stat`` could not tell a same-size,
same-second write apart).

``host_port`` brackets IPv6 literals, as Go's ``net.JoinHostPort``:
``KUBERNETES_SERVICE_HOST`` is one (``fd00::1``) on an IPv6-only cluster.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Generator, Mapping
from pathlib import Path

import httpx

# What says a file changed: the kubelet's atomic swap (a new ``..data`` symlink to a
# new directory) gives a new inode; an in-place write a new mtime or size.
Stamp = tuple[int, int, int]


def host_port(host: str, port: int | str) -> str:
    """``host:port``, with an IPv6 literal (zone included) in brackets, so that a URL
    built from it names that host and not a port of it."""
    bare = host.strip("[]")
    try:
        literal = ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return f"{host}:{port}"
    return f"[{bare}]:{port}" if literal.version == 6 else f"{host}:{port}"


def in_cluster_url(environ: Mapping[str, str] | None = None) -> str:
    """The API server's URL from the variables the kubelet sets in every pod, or ``""``
    when they are not set (not in a cluster)."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    if not host:
        return ""
    return f"https://{host_port(host, env.get('KUBERNETES_SERVICE_PORT') or '443')}"


def _stamp(path: Path) -> Stamp:
    st = path.stat()  # follows the kubelet's symlinks to the current file
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class ServiceAccountAuth(httpx.Auth):
    """Bearer auth from ``<directory>/token``, and the CA of ``<directory>/ca.crt`` in
    ``ssl_context`` (give it to the client as ``verify``), both re-read when their file
    changed; on a 401 the token is read again and the request sent once more."""

    def __init__(self, directory: Path) -> None:
        self.token_file = directory / "token"
        self.ca_file = directory / "ca.crt"
        self.ssl_context = ssl.create_default_context(cafile=str(self.ca_file))
        self._ca_stamp = _stamp(self.ca_file)
        self._token_stamp: Stamp | None = None
        self._token = ""
        self.reads = 0  # how many times the token was read (tests, logs)

    def token(self, *, force: bool = False) -> str:
        """The token, read again if the file changed since the last read (or ``force``)."""
        stamp = _stamp(self.token_file)
        if force or stamp != self._token_stamp:
            self._token = self.token_file.read_text().strip()
            self._token_stamp = stamp
            self.reads += 1
        return self._token

    def _reload_ca(self) -> None:
        """Trust the CA bundle's new content too. The certificates are added to the
        context the client's new connections use (an OpenSSL store only grows): a CA
        taken out of the bundle stays trusted until the process restarts, which is what
        a CA rotation (old and new trusted together for a while) needs anyway."""
        try:
            stamp = _stamp(self.ca_file)
        except OSError:
            return  # mid-swap or gone: keep what we trust
        if stamp != self._ca_stamp:
            self.ssl_context.load_verify_locations(cafile=str(self.ca_file))
            self._ca_stamp = stamp

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self._reload_ca()
        request.headers["Authorization"] = f"Bearer {self.token()}"
        response = yield request
        if response.status_code == 401:
            # A 401 is refused before anything is done: sending it again is safe, also
            # for a Lease write.
            request.headers["Authorization"] = f"Bearer {self.token(force=True)}"
            yield request
