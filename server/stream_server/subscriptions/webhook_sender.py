"""One signed webhook POST, with the address pinned to what was checked.

The order of one ``send``: check the URL's shape (``urls.check_webhook_url``),
resolve the host and check every address (``urls.resolve_checked``), then
connect to one of those addresses, never to the name: the request goes to
``https://<address>:<port>/path`` with the ``Host`` header and the TLS server
name (SNI, and the name the certificate is verified against) set to the
URL's host. A resolver that answers differently a moment later (DNS
rebinding) therefore cannot steer the connection to a private address.

Other choices, each for the same reason (the receiver is untrusted):

- redirects are never followed (a 3xx is a failed delivery), and proxies
  from the environment are ignored (``trust_env=False``);
- the response body is read up to ``max_response_bytes`` raw bytes (64 KiB)
  with ``Accept-Encoding: identity``; a larger or compressed body is not
  parsed (no decompression bombs);
- the whole send (resolution, connect, TLS, request, response) is bounded by
  ``timeout``.

Connections are pooled per (scheme, host name): httpx pools by connection
origin, which here is the address, and a TLS connection made for one name
must not carry another name's request. A small LRU of clients bounds this.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx

from stream_server import __version__
from stream_server.subscriptions.signing import SIGNATURE_HEADER, WebhookKeys
from stream_server.subscriptions.urls import (
    Resolver,
    WebhookAllowList,
    WebhookTarget,
    WebhookUrlRejected,
    check_webhook_url,
    resolve_checked,
)

MAX_RESPONSE_BYTES = 64 * 1024
MAX_CLIENTS = 64


@dataclass(frozen=True)
class Delivery:
    """What one attempt came to. ``ok`` is a 2xx answer; ``json`` is the response body when
    it was a JSON object within the size cap; ``error`` says what went wrong otherwise."""

    status: int | None
    json: dict[str, Any] | None
    error: str | None
    rejected: bool = False  # the URL or its resolved address was refused (SSRF check)
    elapsed: float = 0.0
    address: str | None = None  # the address connected to

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def outcome(self) -> str:
        """A short label for metrics: ok, http_error, rejected, timeout, network_error."""
        if self.ok:
            return "ok"
        if self.rejected:
            return "rejected"
        if self.status is not None:
            return "http_error"
        if self.error and self.error.startswith("timeout"):
            return "timeout"
        return "network_error"


class WebhookSender:
    """Signs and posts webhook bodies; one per server, closed with ``aclose``."""

    def __init__(
        self,
        keys: WebhookKeys,
        allow: WebhookAllowList,
        timeout: float,
        *,
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | bool = True,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        if timeout <= 0:
            raise ValueError("webhook timeout must be positive")
        self._keys = keys
        self._allow = allow
        self._timeout = timeout
        self._resolver = resolver
        self._verify = verify
        self._max_response = max_response_bytes
        self._clients: OrderedDict[tuple[str, str], httpx.AsyncClient] = OrderedDict()
        self._in_use: dict[tuple[str, str], int] = {}
        self._closed = False

    async def send(self, url: str, body: bytes) -> Delivery:
        started = time.monotonic()
        try:
            target = check_webhook_url(url, self._allow)
        except WebhookUrlRejected as exc:
            return Delivery(None, None, f"rejected: {exc.reason}", rejected=True)
        try:
            async with asyncio.timeout(self._timeout):
                addresses = await resolve_checked(
                    target.host, target.port, self._allow, resolver=self._resolver
                )
                return await self._post(target, addresses, body, started)
        except WebhookUrlRejected as exc:
            return Delivery(None, None, f"rejected: {exc.reason}", True, _since(started))
        except LookupError as exc:
            return Delivery(None, None, f"dns: {exc}", elapsed=_since(started))
        except TimeoutError:
            return Delivery(None, None, f"timeout after {self._timeout:g}s", False, _since(started))

    async def _post(
        self, target: WebhookTarget, addresses: list[str], body: bytes, started: float
    ) -> Delivery:
        key = (target.scheme, target.host)
        client = self._client(key)
        self._in_use[key] = self._in_use.get(key, 0) + 1
        try:
            last_error = "no address"
            for address in addresses:
                try:
                    return await self._post_to(client, target, address, body, started)
                except httpx.ConnectError as exc:
                    last_error = f"connect {address}: {exc or type(exc).__name__}"
                except httpx.TimeoutException as exc:
                    raise TimeoutError from exc
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}".rstrip(": ")
                    return Delivery(None, None, error, False, _since(started), address)
            return Delivery(None, None, last_error, elapsed=_since(started))
        finally:
            self._in_use[key] -= 1
            await self._evict()

    async def _post_to(
        self,
        client: httpx.AsyncClient,
        target: WebhookTarget,
        address: str,
        body: bytes,
        started: float,
    ) -> Delivery:
        ip = ipaddress.ip_address(address)
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        extensions: dict[str, Any] = {}
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        headers = {
            "Host": target.host_header,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": f"durable-streams-py/{__version__} webhook",
            SIGNATURE_HEADER: self._keys.sign(body),
        }
        url = f"{target.scheme}://{host}:{target.port}{target.path}"
        request = client.build_request(
            "POST", url, content=body, headers=headers, extensions=extensions
        )
        response = await client.send(request, stream=True, follow_redirects=False)
        try:
            raw, complete = await self._read_capped(response)
        finally:
            await response.aclose()
        parsed = _json_object(raw) if complete and _identity(response) else None
        error = None if response.is_success else f"receiver answered {response.status_code}"
        return Delivery(response.status_code, parsed, error, False, _since(started), address)

    async def _read_capped(self, response: httpx.Response) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > self._max_response:
                return b"", False
            chunks.append(chunk)
        return b"".join(chunks), True

    def _client(self, key: tuple[str, str]) -> httpx.AsyncClient:
        if self._closed:
            raise RuntimeError("webhook sender is closed")
        client = self._clients.get(key)
        if client is None:
            client = httpx.AsyncClient(
                verify=self._verify,
                trust_env=False,
                follow_redirects=False,
                timeout=httpx.Timeout(self._timeout),
                limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
            )
            self._clients[key] = client
        self._clients.move_to_end(key)
        return client

    async def _evict(self) -> None:
        """Close the least recently used idle clients beyond MAX_CLIENTS."""
        while len(self._clients) > MAX_CLIENTS:
            idle = next((k for k in self._clients if not self._in_use.get(k)), None)
            if idle is None:
                return
            client = self._clients.pop(idle)
            self._in_use.pop(idle, None)
            await client.aclose()

    async def aclose(self) -> None:
        self._closed = True
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.aclose()


def _since(started: float) -> float:
    return time.monotonic() - started


def _identity(response: httpx.Response) -> bool:
    encoding: str = response.headers.get("content-encoding", "identity")
    return encoding.strip().lower() == "identity"


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
