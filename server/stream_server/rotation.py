"""The TLS certificate and the token file, reloaded when they change, without a restart.

cert-manager renews a certificate into its Secret and an operator revokes a
token by editing the token Secret; the kubelet then updates the mounted
files. Read once at start, either change took effect only at the next
restart. Here a watcher compares each file's signature (its resolved path,
device, inode, size, change and modification times) every
``--reload-interval`` seconds, and at once on SIGHUP, and reloads what
changed. A Secret volume updates by swapping its ``..data`` symlink to a new
directory: the mounted name is a symlink that never changes itself, so the
signature follows it (``os.stat``) and records the path it resolves to.

A file that does not load (half-written, a key that does not match its
certificate, JSON that does not parse, a token file with no tokens) is
logged and the previous certificate or tokens stay in use; the next change
to the files is tried again.

Tokens: the server's ``TokenAuth`` takes the new principals in one
assignment, so a request sees either the old set or the new one.

TLS: the listening ``SSLContext`` is never changed in place. OpenSSL's
``load_cert_chain`` loads the certificate before it checks the key, so a key
that does not match would leave the live context with the new certificate
and the old key. Instead a fresh context is built exactly as uvicorn builds
it (uvicorn's ``ssl_context_factory`` hands us its own factory), and the
listening context's SNI callback, which OpenSSL calls early in every
handshake, with or without a server name, moves the new connection onto the
newest context. Connections already open keep the certificate they
negotiated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from stream_server.auth import TokenAuth

log = logging.getLogger("stream_server.rotation")

Signature = tuple[object, ...]
T = TypeVar("T")


def signature(paths: Sequence[str]) -> Signature:
    """What changes when any of ``paths`` is rewritten, replaced or re-pointed."""
    out: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows the symlinks of a Secret volume
            out.append(
                (
                    os.path.realpath(path),
                    st.st_dev,
                    st.st_ino,
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ctime_ns,
                )
            )
        except OSError as exc:
            out.append((path, "missing", exc.errno))
    return tuple(out)


class Reloaded(Generic[T]):
    """A value loaded from files and loaded again when they change, looked at no more
    than once a ``recheck`` seconds when it is asked for: for what the requests
    themselves need (the peer token, the peers' TLS context), with no watcher task.
    A change that does not load (``load`` raises ValueError) keeps the value in use
    and is logged; the next change is tried again."""

    def __init__(
        self, what: str, paths: Sequence[str], load: Callable[[], T], recheck: float
    ) -> None:
        self.what = what
        self.paths = tuple(paths)
        self.load = load
        self.recheck = recheck
        self._seen = signature(self.paths)
        self._value = load()  # at start, where a file that does not load stops the server
        self._checked = time.monotonic()

    def get(self) -> T:
        now = time.monotonic()
        if self.paths and now - self._checked >= self.recheck:
            self._checked = now
            seen = signature(self.paths)
            if seen != self._seen:
                self._seen = seen
                try:
                    self._value = self.load()
                except ValueError as exc:
                    log.error("%s changed but does not load, keeping it: %s", self.what, exc)
                else:
                    log.info("%s reloaded from %s", self.what, ", ".join(self.paths))
        return self._value


@dataclass
class Watched:
    """Files and how to load what they hold; ``load`` raises to keep what is in use."""

    what: str
    paths: tuple[str, ...]
    load: Callable[[], None]
    seen: Signature = field(default=())

    def __post_init__(self) -> None:
        if not self.seen:
            self.seen = signature(self.paths)  # loaded at start, from these files


class FileWatcher:
    """Checks the watched files every ``interval`` seconds and on ``wake()`` (SIGHUP, when
    ``sighup``: one watcher per process answers it)."""

    def __init__(self, watched: Sequence[Watched], interval: float, *, sighup: bool = True) -> None:
        self.watched = list(watched)
        self.interval = interval
        self.sighup = sighup
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def check(self) -> None:
        """Reload what changed since it was last loaded (or last tried)."""
        for item in self.watched:
            now = signature(item.paths)
            if now == item.seen:
                continue
            # Taken before the load: if the files change again while it runs,
            # the next check sees them differ and loads once more.
            item.seen = now
            try:
                item.load()
            except Exception as exc:
                log.error(
                    "%s changed but does not load, keeping the previous one: %s", item.what, exc
                )
            else:
                log.info("%s reloaded from %s", item.what, ", ".join(item.paths))

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self.sighup:
            loop = asyncio.get_running_loop()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.wake)
        self._task = asyncio.create_task(self._run(), name="file-watcher")

    async def stop(self) -> None:
        if self.sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            self.check()


class RotatingTls:
    """uvicorn's ``ssl_context_factory``: the context it builds, and later ones."""

    def __init__(self) -> None:
        self.current: ssl.SSLContext | None = None
        self._build: Callable[[], ssl.SSLContext] | None = None

    def factory(self, config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """Called once by uvicorn with its own way to build the context."""
        self._build = default
        listening = self.current = default()
        listening.sni_callback = self._pick
        return listening

    def load(self) -> None:
        """Build a context from the files now; the next handshake uses it."""
        assert self._build is not None, "uvicorn has not built the TLS context yet"
        self.current = self._build()

    def _pick(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self.current
        if current is not None and current is not ctx:
            conn.context = current


def token_loader(auth: TokenAuth, path: Path) -> Callable[[], None]:
    def load() -> None:
        auth.replace(TokenAuth.from_file(path))

    return load
