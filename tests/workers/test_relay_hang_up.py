"""A client that hangs up while a worker relays its body to the writer ends its
request quietly (``workers/proxy.py``): the relay logged ``Exception in ASGI
application ... LocalProtocolError: Too little data for declared Content-Length``
for every such client. The writer sees the request cut short, as a single process
sees a client that hangs up, and takes nothing of it."""

from __future__ import annotations

import socket

import httpx
import pytest

from testkit import wait_for

pytestmark = pytest.mark.processes

CUT = b"Exception in ASGI application"
HUNG_UP = b"hung up while its request was relayed"


def test_a_client_hanging_up_mid_body_ends_the_relay_quietly(server_factory):
    srv = server_factory("--workers", "2", "--log-level", "debug").start()
    stream = f"{srv.base}s"
    assert httpx.put(stream, content=b"before", headers={"content-type": "text/plain"}).is_success
    wake = f"{srv.base}wake"
    assert httpx.put(wake, headers={"content-type": "application/json"}).is_success
    subscription = f"{srv.base}__ds/subscriptions/sub"
    # A whole subscription, but short of the length the head declares: a relay that
    # sent it as if whole would have the writer create it.
    config = b'{"type": "pull-wake", "pattern": "**", "wake_stream": "wake"}'
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as client:
        client.sendall(
            b"PUT /v1/stream/__ds/subscriptions/sub HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n"
            b"Expect: 100-continue\r\n\r\n" % (len(config) + 1)
        )
        # The worker asks for the body once the relay has sent the head to the writer.
        assert b"100 Continue" in client.recv(1024)
        client.sendall(config)  # then hangs up
    log = srv.log_path
    wait_for(
        lambda: HUNG_UP in log.read_bytes() or CUT in log.read_bytes(),
        message=lambda: srv.log(),
    )
    assert httpx.get(subscription).status_code == 404  # the writer took none of it
    assert httpx.get(stream, params={"offset": "-1"}).content == b"before"
    assert httpx.get(wake, params={"offset": "-1"}).json() == []
    whole = httpx.put(subscription, content=config, headers={"content-type": "application/json"})
    assert whole.status_code == 201, whole.text  # the same body, whole, is taken
    assert srv.stop() == 0
    text = log.read_bytes()
    assert CUT not in text and b"Traceback" not in text, text.decode()[-3000:]
