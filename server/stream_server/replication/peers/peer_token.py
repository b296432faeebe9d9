"""The replica set's shared secret: who may follow, copy the data or hand over.

``/replication/stream`` carries every write, ``/replication/snapshot`` is a
copy of all data and ``/replication/switchover`` moves the primary: none of
them may be open to whoever reaches the pod. With ``--replication-token-file``
every replica reads one secret (the operator's ``<name>-replication`` Secret,
mounted), asks for it as ``Authorization: Bearer <secret>`` on those endpoints
and sends it with its own stream and snapshot requests. ``GET /replication`` stays open: probes,
the operator's status and humans read it, and it holds no data.

The file is read again when it changes, as the client token file is
(``rotation.signature``: a Secret volume swaps a symlink), checked at most
once a ``RECHECK`` seconds when a request needs it, so there is no watcher
task. A file that no longer loads (emptied, removed) keeps the secret in use
and is logged; the next change is tried again.

The file may hold several tokens, one a line: the first is the one sent, every one is
accepted. That is how the operator rotates the secret with no replica refusing
another while the kubelet updates each pod's copy at its own moment
(stream_operator/token_rotation.py): ``old`` + ``new`` (new accepted), then
``new`` + ``old`` (new sent), then ``new`` alone.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

from stream_server.rotation import Reloaded

log = logging.getLogger("stream_server.replication")

RECHECK = 1.0  # seconds between two looks at the file's signature
# The answer (401) on every peer endpoint to a request without the token.
REFUSED = {"error": {"code": "UNAUTHORIZED", "message": "the replica set's token is required"}}
CHALLENGE = 'Bearer realm="replication"'  # its WWW-Authenticate


def read_secret(path: str) -> str:
    """The file's secret, whitespace stripped; ValueError naming the setting otherwise."""
    try:
        secret = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"replication-token-file {path!r} cannot be read: {exc}") from None
    if not secret:
        raise ValueError(f"replication-token-file {path!r} holds no token")
    return secret


def _tokens(path: str) -> tuple[str, ...]:
    """The file's tokens, one a line (``read_secret`` refuses an empty file)."""
    return tuple(line.strip() for line in read_secret(path).splitlines() if line.strip())


class PeerToken:
    """The secret from one file, and the check of a request's ``Authorization``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._tokens = Reloaded("the peer token file", (path,), lambda: _tokens(path), RECHECK)

    def accepted(self) -> tuple[str, ...]:
        """Every token the file holds, the one sent first (split once a load)."""
        return self._tokens.get()

    def secret(self) -> str:
        return self.accepted()[0]

    def allows(self, authorization: str | None) -> bool:
        """Whether a request's ``Authorization`` header carries one of the tokens."""
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        # Every one compared (no early exit): the time taken says nothing of which matched.
        matches = [hmac.compare_digest(given.strip().encode(), t.encode()) for t in self.accepted()]
        return any(matches)

    def headers(self) -> dict[str, str]:
        """What this replica sends on its own requests to a peer."""
        return {"Authorization": f"Bearer {self.secret()}"}
