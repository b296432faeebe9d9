"""What the stream routes read of the settings, for the writer and its workers alike."""

from __future__ import annotations

from pathlib import Path

from stream_server.auth import TokenAuth
from stream_server.config import Settings
from stream_server.protocol.context import ProtocolSettings

WRITE_METHODS = frozenset({"PUT", "POST", "DELETE", "PATCH"})


def protocol_settings(s: Settings) -> ProtocolSettings:
    """What the protocol handlers read, from the settings' one home."""
    return ProtocolSettings(
        base_path=s.base_path,
        long_poll_timeout=s.long_poll_timeout,
        sse_reconnect_interval=s.sse_reconnect_interval,
        max_body_bytes=s.max_body_bytes,
        max_read_bytes=s.max_read_bytes,
        max_path_bytes=s.max_path_bytes,
        slow_append_seconds=s.slow_append_seconds,
        max_live_readers=s.max_live_readers,
        max_live_readers_per_client=s.max_live_readers_per_client,
        body_timeout=s.body_timeout,
        min_body_rate=s.min_body_rate,
    )


def token_auth(s: Settings) -> TokenAuth | None:
    """The clients' tokens (``--auth-tokens-file``); None: no token asked."""
    return TokenAuth.from_file(Path(s.auth_tokens_file)) if s.auth_tokens_file else None
