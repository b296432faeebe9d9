"""The webhook signing key ring: Ed25519 keys kept in the data directory.

Why a file in the data directory: receivers pin the server's keys through the
JWKS, so a key must outlive a restart or every receiver would see signatures
from a key it has never fetched (and an image-baked key would be shared by
every deployment). The file lives next to the streams, so the key is backed up
and restored with them; it is never part of the image.

Layout: ``<data_dir>/webhook-keys/keyring.json`` (mode 0600, directory 0700),
replaced atomically (temp file, fsync, rename, fsync directory) under an
exclusive ``flock`` on ``.lock``, so a rotation from the command line and one
from the running server cannot interleave. The file holds the current key
(private part, base64url) and the retired keys' public parts only, each with
the time it was retired: a retired key is published in the JWKS for the
replay window (deliveries signed just before a rotation must still verify
for receivers that cache the JWKS) and then dropped.

Key ids follow the protocol's advice (derive them from key material): ``ds_``
plus the RFC 7638 JWK thumbprint, so a kid is stable for the key's lifetime
and unique within the set.

Signing is in memory and cheap; loading, rotating and refreshing touch the
disk (fsync), so the server calls them off the event loop.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from stream_server.streams.clock import WALL_CLOCK, Clock

KEYRING_DIR = "webhook-keys"
KEYRING_FILE = "keyring.json"
LOCK_FILE = ".lock"
FORMAT_VERSION = 1
DEFAULT_REPLAY_WINDOW = 24 * 3600.0
SIGNATURE_HEADER = "Webhook-Signature"


class KeyRingError(Exception):
    """The key ring on disk cannot be used (unreadable, foreign format, bad key)."""


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_x(key: Ed25519PublicKey) -> str:
    return b64url(key.public_bytes(Encoding.Raw, PublicFormat.Raw))


def thumbprint_kid(x: str) -> str:
    """``ds_`` + the RFC 7638 thumbprint: SHA-256 over the required members, sorted, no spaces."""
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    return "ds_" + b64url(hashlib.sha256(canonical.encode("ascii")).digest())


@dataclass(frozen=True)
class RetiredKey:
    kid: str
    x: str
    retired_at: float


@dataclass(frozen=True)
class _Ring:
    """One consistent state of the ring: swapped whole, so a signer never sees half a rotation."""

    private: Ed25519PrivateKey
    kid: str
    x: str
    created_at: float
    retired: tuple[RetiredKey, ...]

    def to_json(self) -> dict[str, Any]:
        raw = self.private.private_bytes_raw()
        return {
            "version": FORMAT_VERSION,
            "current": {
                "kid": self.kid,
                "d": b64url(raw),
                "x": self.x,
                "created_at": self.created_at,
            },
            "retired": [{"kid": r.kid, "x": r.x, "retired_at": r.retired_at} for r in self.retired],
        }

    @classmethod
    def from_json(cls, doc: Any, source: Path) -> _Ring:
        try:
            if doc.get("version") != FORMAT_VERSION:
                raise KeyRingError(
                    f"{source}: key ring version {doc.get('version')!r} is not "
                    f"{FORMAT_VERSION}; this server does not understand it"
                )
            cur = doc["current"]
            private = Ed25519PrivateKey.from_private_bytes(b64url_decode(cur["d"]))
            x = public_x(private.public_key())
            if x != cur["x"] or thumbprint_kid(x) != cur["kid"]:
                raise KeyRingError(f"{source}: current key does not match its kid")
            retired = tuple(
                RetiredKey(str(r["kid"]), str(r["x"]), float(r["retired_at"]))
                for r in doc.get("retired", [])
            )
            return cls(private, cur["kid"], x, float(cur["created_at"]), retired)
        except KeyRingError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise KeyRingError(f"{source}: malformed key ring ({exc})") from exc

    @classmethod
    def fresh(cls, now: float, retired: tuple[RetiredKey, ...] = ()) -> _Ring:
        private = Ed25519PrivateKey.generate()
        x = public_x(private.public_key())
        return cls(private, thumbprint_kid(x), x, now, retired)


class WebhookKeys:
    """The server's webhook signing keys; see the module docstring for the design."""

    def __init__(
        self, directory: Path, ring: _Ring, replay_window: float, clock: Clock = WALL_CLOCK
    ) -> None:
        self._dir = directory
        self._clock = clock  # key ages, the replay window and signature timestamps
        self._ring = ring
        self._replay_window = replay_window
        self._stamp = self._file_stamp()
        self._lock = threading.Lock()

    # -- loading and saving -------------------------------------------------

    @classmethod
    def load_or_create(
        cls,
        directory: Path,
        *,
        replay_window: float = DEFAULT_REPLAY_WINDOW,
        clock: Clock = WALL_CLOCK,
    ) -> WebhookKeys:
        """Open the ring in ``directory`` (e.g. ``data_dir / "webhook-keys"``), creating a
        first key if there is none. Retired keys past the replay window are pruned."""
        if replay_window < 0:
            raise ValueError("replay window must not be negative")
        directory = Path(directory)
        _make_private_dir(directory)
        with _locked(directory):
            ring = _read(directory)
            now = clock()
            if ring is None:
                ring = _Ring.fresh(now)
                _write(directory, ring)
            else:
                pruned = _prune(ring, now, replay_window)
                if pruned != ring:
                    ring = pruned
                    _write(directory, ring)
        return cls(directory, ring, replay_window, clock)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = (self._dir / KEYRING_FILE).stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self) -> bool:
        """Reload the ring if the file changed under us (a rotation from the command
        line while the server runs). Returns whether it changed."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        with _locked(self._dir):
            ring = _read(self._dir)
            if ring is None:
                return False
            with self._lock:
                self._ring = ring
                self._stamp = self._file_stamp()
        return True

    # -- the public face ----------------------------------------------------

    @property
    def kid(self) -> str:
        return self._ring.kid

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def created_at(self) -> float:
        """When the current key was made (unix seconds); the rotation interval counts from it."""
        return self._ring.created_at

    def sign(self, body: bytes, now: int | None = None) -> str:
        """The ``Webhook-Signature`` value for ``body``: Ed25519 over ``<t>.<body>``."""
        ring = self._ring
        t = int(self._clock()) if now is None else int(now)
        sig = ring.private.sign(str(t).encode("ascii") + b"." + body)
        return f"t={t},kid={ring.kid},ed25519={b64url(sig)}"

    def jwks(self, now: float | None = None) -> dict[str, list[dict[str, str]]]:
        """The JWK Set: the current key first, then retired keys still in the replay window."""
        ring = self._ring
        now = self._clock() if now is None else now
        keys = [_jwk(ring.kid, ring.x)]
        keys += [_jwk(r.kid, r.x) for r in ring.retired if now - r.retired_at < self._replay_window]
        return {"keys": keys}

    def rotate(self, now: float | None = None) -> str:
        """Make a new current key; the old one's public part stays published for the
        replay window. Read-modify-write under the file lock, so a concurrent rotation
        elsewhere is built upon, not overwritten. Returns the new kid."""
        now = self._clock() if now is None else now
        with _locked(self._dir):
            ring = _read(self._dir) or self._ring
            retired = (RetiredKey(ring.kid, ring.x, now), *ring.retired)
            new = _prune(_Ring.fresh(now, retired), now, self._replay_window)
            _write(self._dir, new)
            with self._lock:
                self._ring = new
                self._stamp = self._file_stamp()
        return new.kid

    def maybe_rotate(self, interval: float, now: float | None = None) -> str | None:
        """Rotate when the current key is ``interval`` seconds old (0: never). For the
        server's periodic task; it also picks up a rotation made on the command line."""
        self.refresh()
        now = self._clock() if now is None else now
        if interval <= 0 or now - self._ring.created_at < interval:
            return None
        return self.rotate(now)


def keyring_directory(data_dir: Path) -> Path:
    return Path(data_dir) / KEYRING_DIR


def rotate_command(data_dir: Path, replay_window: float) -> int:
    """``durable-streams-server rotate-webhook-key``: rotate the ring in ``data_dir``.
    Refuses a directory that holds no server data, so a typo does not mint a stray key."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        print(f"rotate-webhook-key: no data directory at {data_dir}", file=sys.stderr)
        return 1
    try:
        keys = WebhookKeys.load_or_create(keyring_directory(data_dir), replay_window=replay_window)
        old = keys.kid
        new = keys.rotate()
    except (KeyRingError, OSError) as exc:
        print(f"rotate-webhook-key: {exc}", file=sys.stderr)
        return 1
    print(
        f"webhook signing key rotated: {old} -> {new} ({old} stays in the JWKS for "
        f"{replay_window:g} s)"
    )
    return 0


def _jwk(kid: str, x: str) -> dict[str, str]:
    return {"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": kid, "x": x}


def _prune(ring: _Ring, now: float, window: float) -> _Ring:
    kept = tuple(r for r in ring.retired if now - r.retired_at < window)
    if kept == ring.retired:
        return ring
    return _Ring(ring.private, ring.kid, ring.x, ring.created_at, kept)


def _make_private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _read(directory: Path) -> _Ring | None:
    path = directory / KEYRING_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyRingError(f"{path}: cannot read the webhook key ring ({exc})") from exc
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise KeyRingError(f"{path}: not JSON ({exc})") from exc
    return _Ring.from_json(doc, path)


def _write(directory: Path, ring: _Ring) -> None:
    """Replace the ring file atomically: readers see the old file or the new one, and
    after a crash the new one only if it is complete and on disk."""
    data = json.dumps(ring.to_json(), indent=1).encode()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".keyring-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, directory / KEYRING_FILE)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
