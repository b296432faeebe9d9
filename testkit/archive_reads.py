"""What an archive holds, read straight from the store for the tests' checks."""

from __future__ import annotations

from typing import Any

import httpx

from stream_format.archive import WAL_PREFIX, ArchiveLocation, decode_frames_object
from stream_format.wal import WRITE, decode_frame


def archived_frames(client: Any, url: str) -> list[tuple[int, int, bytes]]:
    """(term, lsn, frame) of every archived frame, in name order, every object decoded
    (its checksums checked)."""
    loc = ArchiveLocation.parse(url)
    out: list[tuple[int, int, bytes]] = []
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=loc.bucket, Prefix=loc.key(WAL_PREFIX)
    )
    for page in pages:
        for item in page.get("Contents", ()):
            name = item["Key"][len(loc.prefix) :]
            body = client.get_object(Bucket=loc.bucket, Key=item["Key"])["Body"].read()
            obj = decode_frames_object(name, body)
            out.extend((obj.term, f.lsn, f.frame) for f in obj.frames)
    return out


def written_bytes(frames: list[tuple[int, int, bytes]]) -> bytes:
    """Every record write the frames carry, concatenated in lsn order."""
    return b"".join(bytes(e[3]) for _, _, f in frames for e in decode_frame(f)[1] if e[0] == WRITE)


def status(server_url: str) -> dict[str, Any]:
    answer = httpx.get(f"{server_url}/_archive/status", timeout=10)
    answer.raise_for_status()
    doc: dict[str, Any] = answer.json()
    return doc
