"""The start's log and metrics count the whole start, not the engine's recovery alone.

At 1M streams recovery logged 19.4 s while the server became ready 29 s
after it started: the ~9.5 s of making each stored stream servable on the
event loop (``StreamStore.start``) ran after the engine's timer stopped. The
log line now gives the whole recovery with its two parts, and how long after
the process's start the server was ready; the metrics say the same.
"""

from __future__ import annotations

import gc
import logging
import re

import pytest

from stream_server.background_recovery import BackgroundRecovery
from stream_server.streams.store import StreamStore
from testkit.asgi import in_process

CT = {"content-type": "text/plain"}
STREAMS = 20


def gauge(text: str, name: str) -> float:
    m = re.search(rf"^durable_streams_{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, text[:2000]
    return float(m.group(1))


async def test_the_recovery_line_counts_loading_the_streams_and_the_whole_start(tmp_path, caplog):
    data = tmp_path / "data"
    async with in_process(data) as first:
        for i in range(STREAMS):
            r = await first.client.put(f"{first.base}s{i}", headers=CT, content=b"x")
            assert r.status_code == 201
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="stream_server"):
        async with in_process(data) as second:
            text = (await second.client.get("/metrics")).text
    [line] = [r for r in caplog.records if r.getMessage().startswith("recovery finished in")]
    [event] = [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "fields", {}).get("event") == "recovery"
    ]
    assert event["streams"] == STREAMS
    assert event["load_seconds"] > 0
    assert event["seconds"] >= event["engine_seconds"] + event["load_seconds"]
    assert event["startup_seconds"] >= event["seconds"]
    message = line.getMessage()
    for key in ("seconds", "engine_seconds", "load_seconds", "startup_seconds"):
        assert f"{event[key]:.3f}s" in message, (key, message)
    assert gauge(text, "recovery_duration_seconds") == pytest.approx(event["seconds"])
    assert gauge(text, "startup_duration_seconds") == pytest.approx(event["startup_seconds"])


@pytest.mark.parametrize("freeze", [False, True])
async def test_only_the_server_process_puts_what_its_start_built_beyond_the_collector(
    tmp_path, freeze
):
    """A full collection walked every object of a million streams while appends waited
    on the loop; the server process freezes what its start built (``server.py`` sets
    ``freeze_gc``), a process that hosts the app among other things does not."""
    store = StreamStore(tmp_path / "data")
    recovery = BackgroundRecovery(store)
    recovery.freeze_gc = freeze
    before = gc.get_freeze_count()
    try:
        await recovery._run()
        assert recovery.finished
        assert (gc.get_freeze_count() > before) is freeze
    finally:
        gc.unfreeze()
        await store.stop()
