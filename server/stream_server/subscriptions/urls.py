"""Webhook URL safety (SSRF): which targets the server may post to.

The rule (PROTOCOL.md 6.2 and 12.8): ``https://`` only, except the development
exception ``http://localhost`` and ``http://127.0.0.x``; private, loopback,
link-local and other non-public targets are refused, unless an operator's
allow-list opens them (in-cluster receivers are a real use case).

Two checks, because a name is not an address:

- ``check_webhook_url`` at configuration time, without DNS: the URL's shape,
  its scheme, and the host when it is an IP literal.
- ``resolve_checked`` at every delivery: every address the name resolves to
  must pass, and the sender connects to one of exactly those addresses
  (pinned), so a name that resolves to a public address when checked and to
  ``10.0.0.5`` a second later (DNS rebinding) cannot reach the private one.

Decisions where the protocol is silent:

- The development exception is the name ``localhost`` (whatever loopback
  address it resolves to; any other address it resolved to is refused) and
  the literals 127.0.0.0/24. Other loopback addresses (``127.1.2.3``,
  ``[::1]``) and other names that resolve to loopback are refused unless
  allow-listed.
- Allow-list entries are CIDRs (``10.0.0.0/8``, ``fd00::/8``; a single
  address is a /32 or /128) or host names (``receiver.ns.svc``; a leading
  ``*.`` allows any name below it). A URL whose host is itself allow-listed
  (by name, or a literal inside an allowed CIDR) may use ``http://``: inside a
  cluster TLS is often not there, and the operator chose that target by name.
  A name that is not listed but resolves into an allowed CIDR must still use
  ``https://``. An allow-listed name may resolve to any unicast address.
- IPv6 forms that embed an IPv4 address (IPv4-mapped, 6to4, NAT64, Teredo)
  are judged by the embedded address too, and IPv4 written in legacy forms
  (``127.1``, ``0x7f.0.0.1``, ``2130706433``) is refused outright: resolvers
  and HTTP stacks disagree on what they mean.
- User info (``user:pass@``) and fragments are refused: credentials would be
  stored and echoed in subscription responses, and a fragment is never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048
DEV_LOOPBACK = ipaddress.ip_network("127.0.0.0/24")
NAT64 = ipaddress.ip_network("64:ff9b::/96")

# host, port -> resolved addresses (strings). The default asks the system resolver.
Resolver = Callable[[str, int], Awaitable[list[str]]]


class WebhookUrlRejected(ValueError):
    """A webhook URL or the address it resolves to is not an allowed target."""

    code = "WEBHOOK_URL_REJECTED"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class WebhookAllowList:
    """Targets the operator opened on purpose (``--webhook-allow``)."""

    networks: tuple[IPNetwork, ...] = ()
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # from "*.ns.svc": ".ns.svc"

    @classmethod
    def from_settings(cls, entries: Iterable[str]) -> WebhookAllowList:
        """Parse entries; a malformed one raises ValueError naming it (a typo must not
        silently open, or fail to open, a network)."""
        networks: list[IPNetwork] = []
        names: set[str] = set()
        suffixes: list[str] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            if "/" in entry or _looks_numeric(entry):
                try:
                    networks.append(ipaddress.ip_network(entry, strict=True))
                except ValueError as exc:
                    raise ValueError(f"webhook allow-list entry {entry!r}: {exc}") from None
                continue
            wildcard = entry.startswith("*.")
            name = _normalise_name(entry[2:] if wildcard else entry)
            if name is None or "*" in name:
                raise ValueError(
                    f"webhook allow-list entry {entry!r} is neither a CIDR nor a host name"
                )
            if wildcard:
                suffixes.append("." + name)
            else:
                names.add(name)
        return cls(tuple(networks), frozenset(names), tuple(suffixes))

    def allows_name(self, host: str) -> bool:
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    def allows_address(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.networks if net.version == ip.version)

    def __bool__(self) -> bool:
        return bool(self.networks or self.names or self.suffixes)


@dataclass(frozen=True)
class WebhookTarget:
    """A checked URL taken apart: the sender connects from these pieces, never from a
    second parse of the string (two parsers disagreeing is an SSRF classic)."""

    scheme: str
    host: str  # lower-case name without trailing dot, or the IP literal (no brackets)
    port: int
    path: str  # path and query, as sent on the request line
    literal: IPAddress | None

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if isinstance(self.literal, ipaddress.IPv6Address) else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def check_webhook_url(url: str, allow: WebhookAllowList) -> WebhookTarget:  # noqa: C901 - a security check kept in one reading order
    """Check a webhook URL without DNS; raise WebhookUrlRejected with a reason a user
    can act on. Returns the parsed target (callers may ignore it)."""
    if not isinstance(url, str) or not url:
        raise WebhookUrlRejected("webhook.url must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookUrlRejected(f"webhook.url is longer than {MAX_URL_LENGTH} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in url):
        raise WebhookUrlRejected("webhook.url contains whitespace, control characters or '\\'")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookUrlRejected(f"webhook.url is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookUrlRejected("webhook.url must use https:// (http:// only for localhost)")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise WebhookUrlRejected("webhook.url must not carry credentials (user@host)")
    if parts.fragment or url.endswith("#"):
        raise WebhookUrlRejected("webhook.url must not have a fragment")
    raw_host = parts.hostname or ""
    if not raw_host:
        raise WebhookUrlRejected("webhook.url has no host")
    literal = _ip_literal(raw_host, parts.netloc)
    if literal is None:
        host = _normalise_name(raw_host)
        if host is None:
            raise WebhookUrlRejected(f"webhook.url host {raw_host!r} is not a valid host name")
    else:
        host = str(literal)
    port = port if port is not None else (443 if scheme == "https" else 80)
    if port == 0:
        raise WebhookUrlRejected("webhook.url port must be 1 to 65535")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    target = WebhookTarget(scheme, host, port, path, literal)

    dev = _is_dev_host(host, literal)
    listed = allow.allows_address(literal) if literal is not None else allow.allows_name(host)
    if scheme == "http" and not (dev or listed):
        raise WebhookUrlRejected(
            "webhook.url must use https:// (http:// is allowed only for localhost, "
            "127.0.0.x and allow-listed hosts)"
        )
    if literal is not None and not dev:
        problem = address_problem(literal, allow)
        if problem:
            raise WebhookUrlRejected(f"webhook.url host {host} is {problem}")
    return target


async def resolve_checked(  # noqa: C901 - a security check kept in one reading order
    host: str, port: int, allow: WebhookAllowList, *, resolver: Resolver | None = None
) -> list[str]:
    """Resolve ``host`` and check every address; all must pass (a name that answers with
    one public and one private address is refused, not filtered: it is either misconfigured
    or hostile). Returns the addresses in resolver order, for the sender to pin."""
    literal = _ip_literal(host, host)
    if literal is not None:
        if not _is_dev_host(str(literal), literal):
            problem = address_problem(literal, allow)
            if problem:
                raise WebhookUrlRejected(f"{literal} is {problem}")
        return [str(literal)]
    name = _normalise_name(host)
    if name is None:
        raise WebhookUrlRejected(f"{host!r} is not a valid host name")
    try:
        found = await (resolver or system_resolve)(name, port)
    except OSError as exc:
        raise LookupError(f"cannot resolve {name}: {exc}") from exc
    if not found:
        raise LookupError(f"{name} resolves to no address")
    addresses: list[str] = []
    for text in found:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id
        if name == "localhost":
            if not ip.is_loopback:
                raise WebhookUrlRejected(f"localhost resolves to {ip}, which is not loopback")
        elif allow.allows_name(name):
            if ip.is_multicast or ip.is_unspecified:
                raise WebhookUrlRejected(f"{name} resolves to {ip}, which is not unicast")
        else:
            problem = address_problem(ip, allow)
            if problem:
                raise WebhookUrlRejected(f"{name} resolves to {ip}, which is {problem}")
        if str(ip) not in addresses:
            addresses.append(str(ip))
    return addresses


async def check_webhook_url_resolving(
    url: str, allow: WebhookAllowList, *, resolver: Resolver | None = None
) -> WebhookTarget:
    """``check_webhook_url``, then resolve the name now and check the addresses, so a
    configuration naming a host that resolves to a private address is refused up front.
    A name that does not resolve (yet) is accepted: delivery checks again every time."""
    target = check_webhook_url(url, allow)
    if target.literal is None and not _is_dev_host(target.host, None):
        with contextlib.suppress(LookupError):
            await resolve_checked(target.host, target.port, allow, resolver=resolver)
    return target


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


def address_problem(ip: IPAddress, allow: WebhookAllowList) -> str | None:
    """Why ``ip`` is not a public unicast target (None: it is, or it is allow-listed).
    An IPv6 form that carries an IPv4 address on the wire (IPv4-mapped, NAT64) is judged
    as that IPv4 address; 6to4 and Teredo addresses must pass and so must the IPv4
    addresses they embed."""
    if allow.allows_address(ip):
        return None
    wire = _wire_v4(ip)
    if wire is not None:
        problem = None if allow.allows_address(wire) else _own_problem(wire)
        return f"an IPv6 form of {wire}, which is {problem}" if problem else None
    problem = _own_problem(ip)
    if problem:
        return problem
    for inner in _embedded_v4(ip):
        if not allow.allows_address(inner):
            problem = _own_problem(inner)
            if problem:
                return f"an IPv6 form of {inner}, which is {problem}"
    return None


def _wire_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address a connection to ``ip`` really reaches, for mapped and NAT64 forms."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _own_problem(ip: IPAddress) -> str | None:
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv6Address) and ip in ipaddress.ip_network("fc00::/7"):
        return "a unique local (private) IPv6 address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "not a public address"
    return None


def _embedded_v4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    inner: list[ipaddress.IPv4Address] = []
    if ip.sixtofour is not None:
        inner.append(ip.sixtofour)
    if ip.teredo is not None:
        inner.extend(ip.teredo)
    # IPv4-compatible (deprecated ::a.b.c.d) is not global anyway: refused by _own_problem.
    return inner


def _is_dev_host(host: str, literal: IPAddress | None) -> bool:
    if literal is None:
        return host == "localhost"
    return isinstance(literal, ipaddress.IPv4Address) and literal in DEV_LOOPBACK


def _ip_literal(host: str, netloc: str) -> IPAddress | None:
    """The IP address ``host`` spells, or None for a name. Legacy IPv4 spellings that
    ``inet_aton`` would accept are refused rather than guessed at."""
    candidate = host.split("%", 1)[0] if ":" in host else host
    try:
        ip = ipaddress.ip_address(candidate)
    except ValueError:
        if _looks_numeric(host):
            raise WebhookUrlRejected(
                f"host {host!r} looks like an IPv4 address in a non-standard form; "
                "write it as four decimal numbers"
            ) from None
        return None
    if "%" in host:
        raise WebhookUrlRejected("IPv6 zone ids are not allowed in webhook URLs")
    return ip


def _looks_numeric(host: str) -> bool:
    """True for strings that some resolver would read as an IPv4 address: digits, dots and
    hex (``0x7f.1``, ``2130706433``), or anything ``inet_aton`` accepts."""
    last = host.rstrip(".").rsplit(".", 1)[-1].lower()
    if last and (last.isdigit() or (last.startswith("0x") and _is_hex(last[2:]))):
        return True
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _normalise_name(host: str) -> str | None:
    """Lower-case, IDNA-encoded, one trailing dot dropped; None if not a DNS host name."""
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    if not name or len(name) > 253:
        return None
    for label in name.split("."):
        if not label or len(label) > 63:
            return None
        if label.startswith("-") or label.endswith("-"):
            return None
        if not all(c.isalnum() or c in "-_" for c in label):
            return None
    return name
