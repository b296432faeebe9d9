"""The test kit's in-process server (testkit/asgi.py) and the fast tier's guard (testkit/tiers.py).

The in-process server is what most of the suite's protocol tests now run
on, so what it promises is checked here: the real engine on disk (a second
start recovers what the first wrote), flags taken as the CLI takes them,
responses streamed as the app sends them (an SSE event arrives while the
response is still open), and a client that goes away ends the app's
response. The guard must refuse a process to an unmarked test, and leave
marked ones alone.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.asgi import in_process
from testkit.tiers import ProcessNotMarked

CT = {"content-type": "application/octet-stream"}


async def test_the_real_engine_keeps_what_a_first_start_wrote(tmp_path):
    async with in_process(tmp_path / "data") as first:
        assert (
            await first.client.put(f"{first.base}s", headers=CT, content=b"ab")
        ).status_code == 201
        assert (
            await first.client.post(f"{first.base}s", headers=CT, content=b"cd")
        ).status_code in (
            200,
            204,
        )
    async with in_process(tmp_path / "data") as second:
        r = await second.client.get(f"{second.base}s?offset=-1")
        assert r.status_code == 200
        assert r.content == b"abcd"
        assert (tmp_path / "data").is_dir()


async def test_flags_are_taken_as_the_command_line_takes_them(tmp_path):
    async with in_process(tmp_path / "data", "--max-body-bytes", "4") as server:
        r = await server.client.put(f"{server.base}s", headers=CT, content=b"12345")
        assert r.status_code == 413
        assert server.app.settings.max_body_bytes == 4


async def test_an_sse_event_arrives_while_the_response_is_open(tmp_path):
    async with in_process(tmp_path / "data", "--sse-reconnect-interval", "600") as server:
        text = {"content-type": "text/plain"}
        await server.client.put(f"{server.base}s", headers=text, content=b"hello")
        url = f"{server.base}s?offset=-1&live=sse"
        async with server.client.stream("GET", url) as r:
            assert r.status_code == 200
            seen = b""
            async for chunk in r.aiter_bytes():
                seen += chunk
                if b"hello" in seen:
                    break
        assert b"hello" in seen
        # The client went away: the app's response ended, no live reader is left.
        assert sum(server.app.streams.live_readers.values()) == 0


def test_the_sync_client_drives_the_same_app(app_server):
    server = app_server()
    assert server.http.put(f"{server.base}s", headers=CT, content=b"x").status_code == 201
    assert server.http.get(f"{server.base}s?offset=-1").content == b"x"
    assert server.http.get(f"{server.url}/readyz").json()["ready"] is True


def test_an_unmarked_test_may_not_start_a_process():
    with pytest.raises(ProcessNotMarked, match=r"pytest\.mark\.processes"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.processes
def test_a_marked_test_may():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
