"""Cluster DNS in miniature: names a test's pods are reached by, resolving to 127.0.0.1.

In a cluster a pod is reached by ``<pod>.<service>-headless.<ns>.svc`` and the client
Service by ``<name>.<ns>.svc``; TLS between replicas checks those names against the
pod's certificate. Here every pod listens on 127.0.0.1, so for the length of a
``with names(...)`` block those names are lines of ``/etc/hosts`` (the resolver every
process on the machine reads, the servers started by the test included). Tests and CI
run as root (as the disk-full tests' mounts need), so the file is writable.

The file is never left half-written: the new content is written to a file next to it
and renamed over it (a reader sees the old or the new file), under a lock shared by
every test process; only the lines this block added are removed afterwards, each
marked with its owner, so two tests in parallel keep each other's names.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

HOSTS = Path("/etc/hosts")
LOCK = Path("/tmp/testkit-hosts.lock")


def _rewrite(change: Callable[[list[str]], list[str]]) -> None:
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lines = HOSTS.read_text().splitlines()
        new = change(lines)
        temp = HOSTS.with_name(f".hosts.{os.getpid()}.{uuid.uuid4().hex}")
        temp.write_text("".join(line + "\n" for line in new))
        os.chmod(temp, HOSTS.stat().st_mode & 0o7777)
        os.replace(temp, HOSTS)


@contextmanager
def names(hostnames: Iterable[str], address: str = "127.0.0.1") -> Iterator[None]:
    """``hostnames`` resolve to ``address`` inside the block."""
    mark = f"# testkit {os.getpid()}-{uuid.uuid4().hex[:8]}"
    added = [f"{address} {host} {mark}" for host in sorted(set(hostnames))]
    _rewrite(lambda lines: [*lines, *added])
    try:
        yield
    finally:
        _rewrite(lambda lines: [line for line in lines if not line.endswith(mark)])
