"""Issue 42: a URL the server builds from its own socket address (a request that sent no
Host header) puts an IPv6 address in brackets. Bound to ``::`` (dual-stack, IPv6-only
clusters), the address is ``fd00::12``; ``http://fd00::12:4437/...`` names no host."""

from __future__ import annotations

import httpx

from stream_server.protocol.create import _absolute_url
from stream_server.protocol.subscriptions import _origin


def test_a_created_streams_url_brackets_the_servers_ipv6_address() -> None:
    scope = {"scheme": "http", "server": ("fd00::12", 4437)}
    url = httpx.URL(_absolute_url(scope, {}, b"/v1/stream/a"))
    assert (url.host, url.port, url.path) == ("fd00::12", 4437, "/v1/stream/a")


def test_the_subscription_origin_brackets_the_servers_ipv6_address() -> None:
    url = httpx.URL(_origin({"scheme": "http", "server": ("::1", 4437)}, {}))
    assert (url.host, url.port) == ("::1", 4437)


def test_an_ipv4_address_is_left_as_it_is() -> None:
    assert _origin({"scheme": "http", "server": ("10.0.0.7", 4437)}, {}) == "http://10.0.0.7:4437"
