"""Issue 25: the operator's API client gives every request a timeout, and refuses writes
while this process may not act (it does not hold the operator's Lease).

Both live in ``call_api``: the kubernetes client (37 and later) sends every request of
its generated API classes through it. Before, the client waited forever for an answer,
and the write check sat in a ``request`` method the client no longer calls.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kopf
import pytest
from kubernetes import client
from kubernetes.config import incluster_config
from silent_peer import Silent

from stream_operator import GROUP, PLURAL, VERSION
from stream_operator.kube import leadership
from stream_operator.kube.apply import read
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream

NS = "default"


@pytest.fixture
def silent() -> Iterator[Silent]:
    peer = Silent()
    try:
        yield peer
    finally:
        peer.close()


def in_a_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``call`` in a thread of its own; the list gets what it raised."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # reported to the test
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failed


@pytest.mark.parametrize("leader_only", [True, False], ids=["handlers", "election"])
def test_a_request_the_api_server_never_answers_fails_by_itself(
    silent: Silent, monkeypatch: pytest.MonkeyPatch, leader_only: bool
):
    """The handlers' client, and the leader election's (whose renewals must end before
    the renew deadline)."""
    from stream_operator.configuration import operator_settings
    from stream_operator.kube import api_client

    short = dataclasses.replace(operator_settings.current(), api_timeout=0.5)
    monkeypatch.setattr(operator_settings, "_current", short)
    ac = api_client.new_api_client(client.Configuration(host=silent.url), leader_only=leader_only)
    caller, failed = in_a_thread(lambda: read(ac, "StatefulSet", NS, "events"))
    # The client closed the request it never had an answer to (this side never closes it).
    assert silent.gave_up.wait(20), "the request is still waiting for an answer"
    caller.join(20)
    assert not caller.is_alive() and failed, "the call did not end"


def test_no_write_while_the_lease_is_not_held():
    from stream_operator.kube import api_client

    with cluster() as c:
        ac = api_client.new_api_client(client.Configuration(host=c.url))
        # A Leadership not (or no longer) elected: this process may not act.
        leadership.install(leadership.Leadership(ac, "durable-streams-operator", NS, "op-a"))
        try:
            assert not leadership.may_act()
            with pytest.raises(kopf.TemporaryError, match="the lease is not held"):
                client.CustomObjectsApi(ac).create_namespaced_custom_object(
                    GROUP, VERSION, NS, PLURAL, durable_stream("x", {})
                )
            assert read(ac, "StatefulSet", NS, "x") is None  # reads go on
            # The election's own client writes (the Lease, to become the leader).
            campaigner = api_client.new_api_client(
                client.Configuration(host=c.url), leader_only=False
            )
            client.CustomObjectsApi(campaigner).create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, durable_stream("y", {})
            )
        finally:
            leadership.install(None)
        names = [o["metadata"]["name"] for o in c.list("DurableStream", NS)]
        assert names == ["y"]


@pytest.mark.parametrize("answered_after", [0.5, 5.0])
def test_a_renewal_counts_from_when_it_was_sent(monkeypatch: pytest.MonkeyPatch, answered_after):
    """A process frozen between its renewal and the answer (SIGSTOP, a stalled node) must
    not, thawed, act as if it had just renewed: another operator may have taken the Lease
    in between. The renewal counts from when it was sent; with a renew deadline of 2 s,
    one answered 5 s later leaves the process unable to write."""
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    clock = [1000.0]
    monkeypatch.setattr(leadership.time, "monotonic", lambda: clock[0])

    def renewal_answered_late(self: object) -> bool:
        clock[0] += answered_after
        return True

    monkeypatch.setattr(
        leaderelection.LeaderElection, "try_acquire_or_renew", renewal_answered_late
    )
    timings = leadership.Timings(lease_duration=3, renew_deadline=2, retry_period=1)
    owner = leadership.Leadership(client.ApiClient(), "lease", NS, "op-a", timings)
    config = electionconfig.Config(
        LeaseLock("lease", NS, "op-a"), 3, 2, 1, owner.elected.set, lambda: None
    )
    assert leadership._Election(config, owner).try_acquire_or_renew()
    owner.elected.set()
    assert owner.held() is (answered_after < timings.renew_deadline)


# -- issue 42: the service-account token, as the kubelet rotates it --------------------------


@pytest.fixture
def in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cluster, Path]]:
    """``api()`` as in a pod: the kubernetes client's own in-cluster loading, from a
    service-account directory in ``tmp_path``, against the emulated API server, which
    lets in only the token ``first``. (The emulator speaks plain HTTP: the loaded
    https URL is pointed at it, nothing else of the loading is changed.)"""
    from stream_operator.kube import api_client

    token = tmp_path / "token"
    token.write_text("first")  # no newline: the kubelet writes none
    (tmp_path / "ca.crt").write_text("not read over plain HTTP\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setattr(client.Configuration, "_default", None)
    monkeypatch.setattr(api_client, "_api", None)
    with cluster() as c:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", c.url.rsplit(":", 1)[1])
        load = incluster_config.InClusterConfigLoader._load_config

        def load_config(self: incluster_config.InClusterConfigLoader) -> None:
            load(self)  # type: ignore[no-untyped-call]
            self.host = c.url  # kept: the client's refresh hook sets it again each time

        monkeypatch.setattr(incluster_config.InClusterConfigLoader, "_load_config", load_config)
        c.api.tokens = {"first"}
        yield c, token


def test_the_operator_sends_the_rotated_token_from_its_next_request(
    in_a_pod: tuple[Cluster, Path],
):
    """The kubernetes client re-reads the token once a minute: a minute of 401s after
    the old one expired (and of every handler's and the election's calls failing)."""
    from stream_operator.kube import api_client

    c, token = in_a_pod
    ac = api_client.api()
    assert read(ac, "StatefulSet", NS, "x") is None
    staged = token.with_name(".token.new")
    staged.write_text("second")
    staged.replace(token)  # as the kubelet swaps the projected volume's files
    c.api.tokens = {"second"}  # and the first has expired
    assert read(ac, "StatefulSet", NS, "x") is None
    assert c.api.unauthorized == 0


def test_a_401_makes_the_operator_read_the_token_again_and_send_once_more(
    in_a_pod: tuple[Cluster, Path],
):
    from stream_operator.kube import api_client

    c, token = in_a_pod
    ac = api_client.api()
    assert read(ac, "StatefulSet", NS, "x") is None
    before = token.stat()  # a change its stat does not show: only the 401 tells
    with token.open("r+") as f:
        f.write("fresh")
    os.utime(token, ns=(before.st_atime_ns, before.st_mtime_ns))
    c.api.tokens = {"fresh"}
    assert read(ac, "StatefulSet", NS, "x") is None
    assert c.api.unauthorized == 1


# -- issue 42: API Priority and Fairness's 429, as client-go answers it ---------------------

AGENT = "durable-streams-operator (test)"


def test_a_429_is_waited_out_and_a_write_sent_once_more():
    """APF refuses before anything is done, so sending a write again is safe. urllib3
    waits out Retry-After for GET, PUT and DELETE (three times), not for POST and PATCH:
    before, the handler failed with the 429 and kopf retried it a minute later."""
    from stream_operator.kube import api_client

    with cluster() as c:
        ac = api_client.new_api_client(client.Configuration(host=c.url), leader_only=False)
        ac.user_agent = AGENT
        c.api.flow.throttle(1, agent=AGENT)
        client.CustomObjectsApi(ac).create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, durable_stream("y", {})
        )
        c.api.flow.throttle(1, agent=AGENT)
        client.CustomObjectsApi(ac).patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, "y", {"metadata": {"labels": {"a": "b"}}}
        )
        c.api.flow.throttle(1, agent=AGENT)
        assert read(ac, "StatefulSet", NS, "x") is None  # urllib3's own retry
        assert c.api.flow.throttled == [AGENT] * 3
        creates = [r for r in c.api.requests if (r.verb, r.resource) == ("create", PLURAL)]
        assert len(creates) == 1, "the refused create never reached the API server"
        [obj] = c.list("DurableStream", NS)
        assert obj["metadata"]["labels"] == {"a": "b"}


def test_a_second_429_is_the_callers_failure():
    """One more attempt, not a loop: a write refused again fails, and the handler's own
    retry (kopf's backoff) takes it from there."""
    from kubernetes.client.exceptions import ApiException

    from stream_operator.kube import api_client

    with cluster() as c:
        ac = api_client.new_api_client(client.Configuration(host=c.url), leader_only=False)
        ac.user_agent = AGENT
        c.api.flow.throttle(2, agent=AGENT)
        with pytest.raises(ApiException) as refused:
            client.CustomObjectsApi(ac).create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, durable_stream("y", {})
            )
        assert refused.value.status == 429
        assert c.api.flow.throttled == [AGENT, AGENT]
        assert c.list("DurableStream", NS) == []


@pytest.mark.parametrize(
    ("status", "headers", "wait"),
    [
        (429, {"Retry-After": "1"}, 1.0),
        (429, {"Retry-After": "0"}, 0.0),
        (429, {}, None),  # nothing said: the caller's failure, as client-go has it
        (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # client-go: seconds only
        (429, {"Retry-After": "3600"}, None),  # longer than a worker should be held
        (503, {"Retry-After": "1"}, None),
        (200, {"Retry-After": "1"}, None),
    ],
)
def test_retry_after(status: int, headers: dict[str, str], wait: float | None):
    from stream_operator.kube import api_client

    assert api_client.retry_after(status, headers) == wait
