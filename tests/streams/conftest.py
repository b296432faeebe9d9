"""The stream layer's tests: a store over a real engine in a temporary data directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stream_server.streams.store import StreamStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StreamStore]:
    s = StreamStore(tmp_path / "data")
    await s.start()
    yield s
    await s.stop()
