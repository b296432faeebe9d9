"""Issue 42: the replicated server's API clients re-read the pod's service-account token
and CA as the kubelet rotates them, and build the API URL with IPv6 brackets.

Before, ``lease.api_client`` read the token once into the client's headers: once the
kubelet's rotated token replaced it and the old one expired, every Lease renewal (and
every pod-label write) got 401 and the replica set stopped taking writes. And
``https://fd00::1:443`` is no URL of the host ``fd00::1``.

The clients talk over TLS to the emulated API server (testkit.kube), told to accept
only the current token, with the service-account directory in a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from aiohttp.test_utils import RawTestServer

from stream_server.replication.lease import kube_auth, kube_lease
from stream_server.replication.lease.kube_lease import LeaseClient, LeaseUnavailable, api_client
from stream_server.replication.lease.pod_labels import PodClient
from testkit.kube import ApiServer
from testkit.pki import PrivateCA

NS = "default"


@dataclass
class InCluster:
    api: ApiServer
    account: Path  # the service-account directory the clients read
    ca: PrivateCA  # the API server's CA

    def rotate(self, token: str) -> None:
        """A new token, as the kubelet writes it: a new file swapped in whole."""
        staged = self.account / ".token.new"
        staged.write_text(token + "\n")
        staged.replace(self.account / "token")
        self.api.tokens = {token}


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[InCluster]:
    """The emulated API server on https://127.0.0.1, accepting only the token ``first``,
    and the pod's environment pointing at it."""
    ca = PrivateCA(tmp_path / "pki")
    issued = ca.issue("apiserver", "127.0.0.1")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(issued.cert, issued.key)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copy(ca.cert, account / "ca.crt")
    (account / "token").write_text("first\n")
    api = ApiServer()
    api.tokens = {"first"}
    async with api:
        server = RawTestServer(api, host="127.0.0.1")
        await server.start_server(ssl=tls)
        try:
            monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
            monkeypatch.setattr(kube_lease, "SERVICE_ACCOUNT", account)
            yield InCluster(api, account, ca)
        finally:
            await server.close()


@pytest.fixture
async def client(cluster: InCluster) -> AsyncIterator[LeaseClient]:
    """A Lease client made in the cluster's pod environment, closed after the test."""
    made = LeaseClient(f"{NS}/ds-leader")
    yield made
    await made.close()


async def test_the_lease_client_sends_the_rotated_token_from_its_next_request(
    cluster: InCluster, client: LeaseClient
) -> None:
    assert await client.get() is None  # let in (no Lease yet)
    cluster.rotate("second")  # the first one has expired
    assert await client.get() is None
    # The new token went with the request itself: no 401 was needed to find it.
    assert cluster.api.unauthorized == 0


async def test_a_401_makes_the_token_be_read_again_and_the_request_sent_once_more(
    cluster: InCluster, client: LeaseClient
) -> None:
    assert await client.get() is None
    # A change the file's stat does not show (same inode, size and mtime): only the
    # API server's 401 says the token is no longer the one to send.
    token = cluster.account / "token"
    before = token.stat()
    with token.open("r+") as f:
        f.write("fresh\n")
    os.utime(token, ns=(before.st_atime_ns, before.st_mtime_ns))
    cluster.api.tokens = {"fresh"}
    assert await client.get() is None
    assert cluster.api.unauthorized == 1  # one 401, then the retry was let in


async def test_a_token_that_stays_refused_is_reported_after_one_retry(
    cluster: InCluster, client: LeaseClient
) -> None:
    cluster.api.tokens = {"not-ours"}
    with pytest.raises(LeaseUnavailable, match="401"):
        await client.get()
    assert cluster.api.unauthorized == 2  # the request and its one retry, no loop


async def test_the_pod_client_follows_the_rotation_too(cluster: InCluster) -> None:
    pods = PodClient(NS)
    try:
        assert await pods.get("ds-0") is None
        cluster.rotate("second")
        assert await pods.get("ds-0") is None
        assert cluster.api.unauthorized == 0
    finally:
        await pods.close()


async def test_a_new_ca_bundle_is_trusted_from_the_next_connection(
    cluster: InCluster, tmp_path: Path
) -> None:
    """The CA file is re-read as the token is: a client started while the bundle named
    another CA (the API server's CA was being rotated) trusts the new bundle."""
    other = PrivateCA(tmp_path / "other", "other")
    shutil.copy(other.cert, cluster.account / "ca.crt")
    client = LeaseClient(f"{NS}/ds-leader")
    try:
        with pytest.raises(LeaseUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get()
        staged = cluster.account / ".ca.new"
        shutil.copy(cluster.ca.cert, staged)
        staged.replace(cluster.account / "ca.crt")
        assert await client.get() is None
    finally:
        await client.close()


# -- IPv6 ----------------------------------------------------------------------------------


async def test_the_api_url_brackets_an_ipv6_service_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an IPv6-only cluster the kubelet sets KUBERNETES_SERVICE_HOST=fd00::1."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copy(PrivateCA(tmp_path / "pki").cert, account / "ca.crt")
    (account / "token").write_text("t\n")
    monkeypatch.setattr(kube_lease, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    base, http = api_client()
    await http.aclose()
    assert base == "https://[fd00::1]:6443"
    url = httpx.URL(base + "/apis/coordination.k8s.io/v1")
    assert (url.host, url.port) == ("fd00::1", 6443)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("10.96.0.1", "10.96.0.1:443"),
        ("kubernetes.default.svc", "kubernetes.default.svc:443"),
        ("fd00::1", "[fd00::1]:443"),
        ("[fd00::1]", "[fd00::1]:443"),  # already bracketed: not twice
        ("fe80::1%eth0", "[fe80::1%eth0]:443"),  # a zone, as net.JoinHostPort
    ],
)
def test_host_port_brackets_only_ipv6_literals(host: str, expected: str) -> None:
    assert kube_auth.host_port(host, 443) == expected
