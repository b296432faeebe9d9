"""Server-Sent Events framing for stream data and control events."""

from __future__ import annotations

import re

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def data_event_text(payload: bytes) -> bytes:
    """An ``event: data`` whose payload is UTF-8 text, one ``data:`` line per line.

    SSE readers join data lines with a newline, so splitting on line breaks
    round-trips any text whose line breaks are ``\\n``.
    """
    lines = _LINE_BREAK.split(payload)
    return b"event: data\n" + b"".join(_data_line(line) for line in lines) + b"\n"


def _data_line(line: bytes) -> bytes:
    # Readers drop one space after "data:"; add one only when the line starts with a space.
    return (b"data: " if line[:1] == b" " else b"data:") + line + b"\n"


def data_event_raw(encoded: bytes) -> bytes:
    """An ``event: data`` whose payload has no line breaks (base64 text)."""
    return b"event: data\ndata:" + encoded + b"\n\n"


def control_event(json_payload: bytes) -> bytes:
    return b"event: control\ndata:" + json_payload + b"\n\n"
