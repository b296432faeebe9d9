"""What the stream routes read of the settings, for the writer and its workers alike."""

from __future__ import annotations

from pathlib import Path

from stream_server.auth import TokenAuth
from stream_server.config import Settings

WRITE_METHODS = frozenset({"PUT", "POST", "DELETE", "PATCH"})


def token_auth(s: Settings) -> TokenAuth | None:
    """The clients' tokens (``--auth-tokens-file``); None: no token asked."""
    return TokenAuth.from_file(Path(s.auth_tokens_file)) if s.auth_tokens_file else None
