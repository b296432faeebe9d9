"""The golden data directories (tests/fixtures/golden-vN), written once by the server of
each on-disk format: what reading one must give, and a recovered copy to read it from.

A test never opens a golden directory itself with the server: recovery raises it to the
current format and replays its WAL, which would change the committed fixture."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from stream_server.engine.recovery import RecoveryReport
from stream_server.streams.store import StreamStore

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures"


def golden(version: int) -> Path:
    return FIXTURES / f"golden-v{version}"


def expected(version: int) -> dict[str, Any]:
    """``golden_vN.json``: what reading the directory of format N must give."""
    return json.loads((FIXTURES / f"golden_v{version}.json").read_text())


def matches(want: dict[str, Any], payloads: list[bytes]) -> bool:
    """Whether a stream's payloads are what ``want`` says: its JSON messages, or its bytes
    (by content or, for the large ones, by SHA-256)."""
    if "messages" in want:
        return [p.decode() for p in payloads] == want["messages"]
    content = b"".join(payloads)
    if "sha256" in want:
        return hashlib.sha256(content).hexdigest() == want["sha256"]
    return content.hex() == want["bytes_hex"]


def with_recovered_copy(
    version: int,
    into: Path,
    check: Callable[[StreamStore, RecoveryReport], Awaitable[None]],
) -> Path:
    """Copy golden directory ``version`` to ``into``, open a store on the copy (recovering
    it), run ``check`` on it and stop it; return the copy's path."""
    data = into / f"golden-v{version}"
    shutil.copytree(golden(version), data)

    async def run() -> None:
        store = StreamStore(data)
        report = await store.start()
        try:
            await check(store, report)
        finally:
            await store.stop()

    asyncio.run(run())
    return data


async def served_as_expected(store: StreamStore, streams: dict[str, Any]) -> None:
    """Every stream of ``golden_vN.json``'s ``streams`` read from ``store`` from its
    earliest unit: that unit, the tail, the content type and the payloads it says."""
    for path, want in streams.items():
        s = store.get(path)
        assert (store.earliest(s), s.tail) == (want["earliest"], want["tail"]), path
        assert s.meta.content_type == want["content_type"], path
        r = await store.read(s, want["earliest"], 1 << 30)
        assert matches(want, [bytes(p) for p in r.payloads]), path


def spark_reads_as_expected(version: int, into: Path) -> None:
    """The Spark reader on a recovered copy of golden directory ``version`` (recovered
    first, as ``python -m stream_server.recover`` does) reads every stream as expected."""
    from testkit.spark_rows import every_stream

    async def nothing_more(store: StreamStore, report: RecoveryReport) -> None:
        pass

    streams = expected(version)["streams"]
    got, _ = every_stream(with_recovered_copy(version, into, nothing_more))
    assert sorted(got) == sorted(streams)
    for path, want in streams.items():
        assert matches(want, got[path]), path
