"""Network partitions: each server in a network namespace of its own, joined by veth
pairs to a bridge, cut and healed with iptables inside the namespaces.

One ``Net`` per test, every name carrying a per-run tag (``dsf`` + the creating
process's pid in hex + a counter) so that parallel runs never collide::

    root namespace                hub namespace <tag>-hub          member namespaces
    (the test's clients)
    <tag>r  10.X.Y.254 --veth-- vroot --+
                                        br0  10.X.Y.1  (the emulated API server listens here)
                                 v0   --+ --veth-- eth0 10.X.Y.10   <tag>-ds-0
                                 v1   --+ --veth-- eth0 10.X.Y.11   <tag>-ds-1

The API server runs in the hub namespace (``prefix("hub")``), so a server cut
from its peers can still reach it, or not, as the test says; the test process
reaches everyone from the root namespace through ``<tag>r``. The subnet
10.X.Y.0/24 is chosen at random among ones the root namespace has no route
to. The network rule of this project holds by construction: traffic goes to
loopback or to addresses inside these namespaces, nowhere else.

A cut is iptables DROP rules in a member's namespace (the packets vanish, as in
a real partition: no reset, a sender's TCP just retransmits): ``cut(a, b)``
both ways, ``cut(a, b, one_way=True)`` only what ``a`` sends to ``b``.
``heal(a)`` flushes ``a``'s rules. ``close()`` deletes the namespaces (with
them their veths, bridge and rules); a run killed before its teardown leaves
namespaces whose tag names a dead pid, and the next ``Net`` removes those.
Needs root, ``ip`` (iproute2) and ``iptables``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

TAG = "dsf"
_counter = itertools.count()
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
API = "api"  # the hub's address, where the API server listens
CLIENTS = "clients"  # the root namespace's address: the test's own clients


def _run(*argv: str) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def _ip() -> str:
    found = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError("no ip command (Debian's iproute2: make system-deps)")
    return found


def _iptables() -> str:
    found = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError("no iptables command (Debian's iptables: make system-deps)")
    return found


def sweep() -> list[str]:
    """Delete the namespaces (and root veths) of earlier runs whose process is gone."""
    gone = []
    listing = _run(_ip(), "netns", "list")
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(rf"({TAG}([0-9a-f]{{6}})[0-9a-z])-.+", name)
        if m is None or Path(f"/proc/{int(m.group(2), 16)}").exists():
            continue
        with contextlib.suppress(RuntimeError):
            _run(_ip(), "link", "del", f"{m.group(1)}r")
        with contextlib.suppress(RuntimeError):
            _run(_ip(), "netns", "del", name)
            gone.append(name)
    return gone


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200-254.x.0 that no route or address of the root namespace touches."""
    routes = _run(_ip(), "-4", "route", "show", "table", "all")
    taken = []
    for line in routes.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("default", "broadcast", "local", "unreachable"):
            word = line.split()[1] if len(line.split()) > 1 else ""
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(word, strict=False))
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{random.randint(200, 254)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test network")


class Net:
    """A private network for one test's servers; see the module doc."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("network namespaces need root")
        sweep()
        self.ip = _ip()
        self.iptables = _iptables()
        self.tag = f"{TAG}{os.getpid():06x}{_BASE36[next(_counter) % 36]}"
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.addresses: dict[str, str] = {API: str(hosts[0]), CLIENTS: str(hosts[-1])}
        self._next_host = iter(hosts[9:-1])
        self.namespaces: dict[str, str] = {"hub": f"{self.tag}-hub"}
        self.cuts: dict[str, list[list[str]]] = {}
        try:
            self._hub()
        except BaseException:
            self.close()
            raise

    # -- building ------------------------------------------------------------------------

    def _in(self, ns: str, *argv: str) -> str:
        return _run(self.ip, "-n", ns, *argv)

    def _hub(self) -> None:
        hub = self.namespaces["hub"]
        _run(self.ip, "netns", "add", hub)
        self._in(hub, "link", "set", "dev", "lo", "up")
        # A bridge takes the lowest MAC among its ports unless told one; members added
        # while others run would then change it under their ARP caches, and frames to the
        # old address are dropped (not for this host): a fixed address keeps it.
        mac = "02:" + ":".join(f"{random.randint(0, 255):02x}" for _ in range(5))
        self._in(hub, "link", "add", "name", "br0", "address", mac, "type", "bridge")
        self._in(hub, "addr", "add", f"{self.addresses[API]}/24", "dev", "br0")
        self._in(hub, "link", "set", "dev", "br0", "up")
        root_end = f"{self.tag}r"
        _run(self.ip, "link", "add", "name", root_end, "type", "veth", "peer", "name", "vroot",
             "netns", hub)  # fmt: skip
        _run(self.ip, "addr", "add", f"{self.addresses[CLIENTS]}/24", "dev", root_end)
        _run(self.ip, "link", "set", "dev", root_end, "up")
        self._in(hub, "link", "set", "dev", "vroot", "master", "br0", "up")

    def add(self, name: str) -> str:
        """A namespace for the member ``name`` on the bridge; its address."""
        if name in self.namespaces or name in (API, CLIENTS):
            raise ValueError(f"{name!r} is taken")
        ns = f"{self.tag}-{name}"
        hub = self.namespaces["hub"]
        address = str(next(self._next_host))
        port = f"v{len(self.namespaces) - 1}"
        _run(self.ip, "netns", "add", ns)
        self.namespaces[name] = ns
        self._in(ns, "link", "set", "dev", "lo", "up")
        self._in(hub, "link", "add", "name", port, "type", "veth", "peer", "name", "eth0")
        self._in(hub, "link", "set", "dev", "eth0", "netns", ns)
        self._in(hub, "link", "set", "dev", port, "master", "br0", "up")
        self._in(ns, "addr", "add", f"{address}/24", "dev", "eth0")
        self._in(ns, "link", "set", "dev", "eth0", "up")
        self.addresses[name] = address
        return address

    def prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program in ``name``'s namespace (``hub``: the API's)."""
        return [self.ip, "netns", "exec", self.namespaces[name]]

    # -- faults --------------------------------------------------------------------------

    def _rule(self, name: str, *rule: str) -> None:
        _run(self.ip, "netns", "exec", self.namespaces[name], self.iptables, "-A", *rule)
        self.cuts.setdefault(name, []).append(list(rule))

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Drop what ``a`` sends to ``b`` and, unless ``one_way``, what ``b`` sends to ``a``.
        ``b`` is a member, ``API`` or ``CLIENTS``; the rules live in ``a``'s namespace."""
        peer = self.addresses[b]
        self._rule(a, "OUTPUT", "-d", peer, "-j", "DROP")
        if not one_way:
            self._rule(a, "INPUT", "-s", peer, "-j", "DROP")

    def isolate(self, a: str, *, keep: tuple[str, ...] = (CLIENTS,)) -> None:
        """Cut ``a`` both ways from every other member and the API, except ``keep``."""
        for other in self.addresses:
            if other != a and other not in keep:
                self.cut(a, other)

    def heal(self, a: str | None = None) -> None:
        """Remove the cuts in ``a``'s namespace (every namespace's when None)."""
        for name in [a] if a is not None else list(self.cuts):
            for rule in self.cuts.pop(name, []):
                _run(self.ip, "netns", "exec", self.namespaces[name], self.iptables, "-D", *rule)

    def rules(self, name: str) -> str:
        """``iptables -S`` in ``name``'s namespace (for a failure message)."""
        return _run(self.ip, "netns", "exec", self.namespaces[name], self.iptables, "-S")

    # -- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        """Delete everything this network made. Processes still inside a namespace are
        the caller's to stop first (a namespace outlives its name while one runs)."""
        with contextlib.suppress(RuntimeError):
            _run(self.ip, "link", "del", f"{self.tag}r")
        for ns in reversed(list(self.namespaces.values())):
            with contextlib.suppress(RuntimeError):
                _run(self.ip, "netns", "del", ns)
        self.namespaces.clear()
        self.cuts.clear()

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
