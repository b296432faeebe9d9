"""Optional bearer-token access control with scopes per stream-path prefix.

Tokens come from a JSON file (a Kubernetes Secret in the chart)::

    {"tokens": [
      {"name": "orders-writer", "sha256": "<hex of sha256(token)>",
       "scopes": ["read", "write"], "prefixes": ["orders/"]},
      {"name": "ops", "token": "<plain token>", "scopes": ["admin"]}
    ]}

``read`` allows GET and HEAD, ``write`` allows POST and PUT (creating a fork
also needs ``read`` on its source), ``admin`` allows everything including
DELETE. A prefix covers whole path segments (``team1`` covers ``team1/x``, not
``team10/x``); ``""`` (the default) covers every stream. Presented tokens
are hashed and compared with every entry in constant time; no token, hash or
Authorization header is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

SCOPES = ("read", "write", "admin")
METHOD_SCOPE = {"GET": "read", "HEAD": "read", "POST": "write", "PUT": "write", "DELETE": "admin"}


class AuthConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    digest: bytes
    scopes: frozenset[str]
    prefixes: tuple[str, ...]

    def allows(self, scope: str, path: str) -> bool:
        if "admin" not in self.scopes and scope not in self.scopes:
            return False
        return any(covers(p, path) for p in self.prefixes)


def covers(prefix: str, path: str) -> bool:
    """Whether a token's prefix covers ``path``, by whole path segments.

    ``team1`` and ``team1/`` cover ``team1`` and ``team1/x`` but not ``team10/x``:
    a prefix is a place in the stream tree, not a string.
    """
    stem = prefix.rstrip("/")
    return not stem or path == stem or path.startswith(stem + "/")


class Denied(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class TokenAuth:
    def __init__(self, principals: list[Principal]) -> None:
        if not principals:
            raise AuthConfigError("the token file defines no tokens")
        self.principals = principals

    @classmethod
    def from_file(cls, path: Path) -> TokenAuth:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise AuthConfigError(f"cannot read token file {path}: {exc}") from None
        principals = []
        for i, entry in enumerate(data.get("tokens", []) if isinstance(data, dict) else []):
            name = str(entry.get("name") or f"token-{i}")
            if "sha256" in entry:
                try:
                    digest = bytes.fromhex(entry["sha256"])
                except ValueError:
                    raise AuthConfigError(f"{name}: sha256 is not hex") from None
                if len(digest) != 32:
                    raise AuthConfigError(f"{name}: sha256 must be 64 hex digits")
            elif entry.get("token"):
                digest = hashlib.sha256(str(entry["token"]).encode()).digest()
            else:
                raise AuthConfigError(f"{name}: needs 'token' or 'sha256'")
            scopes = frozenset(entry.get("scopes", ["read"]))
            if not scopes or not scopes <= set(SCOPES):
                raise AuthConfigError(f"{name}: scopes must be among {SCOPES}")
            prefixes = tuple(str(p).lstrip("/") for p in entry.get("prefixes", [""]))
            principals.append(Principal(name, digest, scopes, prefixes or ("",)))
        return cls(principals)

    def replace(self, other: TokenAuth) -> None:
        """Take ``other``'s tokens (the file changed): one assignment, so a request
        checks against either the old set or the new one, never a mix."""
        self.principals = other.principals

    def identify(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Denied(401, "authentication required")
        kind, _, token = authorization.strip().partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise Denied(401, "use an Authorization: Bearer token")
        digest = hashlib.sha256(token.strip().encode()).digest()
        found = None
        for p in self.principals:  # no early exit: the time does not depend on which matched
            if hmac.compare_digest(p.digest, digest):
                found = p
        if found is None:
            raise Denied(401, "invalid token")
        return found

    def check(
        self, authorization: str | None, method: str, path: str, fork_source: str | None
    ) -> Principal:
        """The principal allowed to do ``method`` on ``path``, or Denied (401/403)."""
        principal = self.identify(authorization)
        scope = METHOD_SCOPE.get(method, "admin")
        if not principal.allows(scope, path):
            raise Denied(403, f"token may not {scope} this stream")
        if fork_source is not None and not principal.allows("read", fork_source):
            raise Denied(403, "token may not read the fork source")
        return principal
