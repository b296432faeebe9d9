"""Callback and claim tokens: bearer tokens good for one subscription and one wake.

A token is ``<payload>.<mac>``, both unpadded base64url: the payload names
the subscription, the purpose (``callback`` for a webhook, ``claim`` for a
pull-wake lease), the generation and the wake id; the MAC is HMAC-SHA256
under a secret that belongs to the subscription and lives in its durable
keyed value. So a token survives a restart (the secret does), dies with its
subscription (a re-created one draws a new secret), and tells a forged token
(401) from an honest but stale one (409 ``FENCED``, section 7.3) without the
server remembering every token it ever issued.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

CALLBACK = "callback"
CLAIM = "claim"


def new_secret() -> str:
    return secrets.token_hex(32)


def new_wake_id() -> str:
    return "w_" + secrets.token_urlsafe(12)


@dataclass(frozen=True, slots=True)
class TokenClaims:
    subscription: str
    purpose: str
    generation: int
    wake_id: str


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, payload: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), payload, hashlib.sha256).digest()


def issue(secret: str, claims: TokenClaims) -> str:
    payload = json.dumps(
        {
            "s": claims.subscription,
            "p": claims.purpose,
            "g": claims.generation,
            "w": claims.wake_id,
        },
        separators=(",", ":"),
    ).encode()
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def verify(secret: str, token: str) -> TokenClaims | None:
    """The token's claims if ``secret`` signed it, else None."""
    head, sep, mac = token.partition(".")
    if not sep or len(token) > 1024:
        return None
    try:
        payload = _unb64(head)
    except (ValueError, TypeError):
        return None
    # The signature's text is compared, not its decoded bytes: base64's last character
    # carries bits a decoder ignores, so another text can decode to the same bytes, and
    # a token is good only exactly as it was issued.
    if not hmac.compare_digest(mac.encode(), _b64(_mac(secret, payload)).encode()):
        return None
    try:
        d = json.loads(payload)
        return TokenClaims(str(d["s"]), str(d["p"]), int(d["g"]), str(d["w"]))
    except (ValueError, KeyError, TypeError):
        return None
