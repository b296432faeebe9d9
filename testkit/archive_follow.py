"""A source server and a replica cluster's server following its archive, as real
processes, for tests/archive/test_follow*.py.

The source is a plain single node; its archive is made by ``archive_frames.upload_wal``
(the test decides when frames reach it). The follower runs ``--archive-follow`` on
that archive, polling it every ``--archive-timeout``/2 (0.2 s here).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from testkit import wait_for
from testkit.archive_reads import status
from testkit.archive_store import S3Store, server_args
from testkit.server_process import ServerProcess
from testkit.servers import env_with, free_port, stream_server_command

OCTET = {"content-type": "application/octet-stream"}
POLL = "0.4"  # --archive-timeout: the follower lists the archive every 0.2 s


# ``make``: the ``server_factory`` fixture (conftest.py), which stops what it started.
ServerFactory = Callable[..., ServerProcess]


def source(make: ServerFactory, root: Path) -> ServerProcess:
    return make(data_dir=root / "source").start()


def archiving_source(make: ServerFactory, root: Path, store: S3Store, url: str) -> ServerProcess:
    """A source that archives to ``url`` itself, every ``--archive-timeout``."""
    return make(
        *server_args(store, url),
        "--archive-timeout",
        POLL,
        data_dir=root / "source",
        env=store.env(),
    ).start()


def archived(srv: ServerProcess) -> dict[str, Any]:
    """Wait until ``srv``'s archive holds every frame it made durable; its status then."""

    def holds_all() -> dict[str, Any] | None:
        doc = status(srv.url)
        return doc if doc["archived_lsn"] >= doc["durable_lsn"] > 0 else None

    found: dict[str, Any] = wait_for(holds_all, timeout=60, message=lambda: str(status(srv.url)))
    return found


def follower(
    make: ServerFactory,
    root: Path,
    store: S3Store,
    url: str,
    name: str = "follower",
    args: tuple[str, ...] = (),
) -> ServerProcess:
    """The follower, with ``args`` beyond the follow's own (``--workers 2``)."""
    return make(*follow_args(store, url), *args, data_dir=root / name, env=store.env()).start()


def follow_args(store: S3Store, url: str) -> list[str]:
    return ["--archive-follow", "true", *server_args(store, url), "--archive-timeout", POLL]


def refused_start(data_dir: Path, store: S3Store, *args: str) -> str:
    """A server start on ``data_dir`` with ``args`` that must fail: its output."""
    done = subprocess.run(
        stream_server_command(free_port(), data_dir, *args),
        env=env_with(store.env()),
        capture_output=True,
        timeout=60,
    )
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode != 0, f"the start was not refused: {out[-2000:]}"
    return out


def create(
    srv: ServerProcess, path: str, body: bytes = b"", headers: dict[str, str] = OCTET
) -> None:
    r = httpx.put(f"{srv.base}{path}", content=body, headers=headers, timeout=10)
    assert r.status_code in (200, 201), (r.status_code, r.text)


def append(srv: ServerProcess, path: str, body: bytes, headers: dict[str, str] = OCTET) -> None:
    r = httpx.post(f"{srv.base}{path}", content=body, headers=headers, timeout=10)
    assert r.status_code in (200, 204), (r.status_code, r.text)


def read(srv: ServerProcess, path: str) -> tuple[int, bytes, str]:
    """Status, bytes and next offset of a catch-up read of the whole stream."""
    r = httpx.get(f"{srv.base}{path}", params={"offset": "-1"}, timeout=10)
    return r.status_code, r.content, r.headers.get("stream-next-offset", "")


def same(a: ServerProcess, b: ServerProcess, paths: list[str]) -> bool:
    return all(read(a, p) == read(b, p) for p in paths)


def caught_up(
    src: ServerProcess, fol: ServerProcess, paths: list[str], timeout: float = 30
) -> None:
    """Wait until ``fol`` answers every path as ``src`` does (status, bytes, offset)."""
    wait_for(
        lambda: same(src, fol, paths),
        timeout=timeout,
        message=lambda: (
            "the follower did not catch up: "
            + "; ".join(f"{p}: {read(src, p)[:2]} vs {read(fol, p)[:2]}" for p in paths)
            + "\n"
            + fol.log()[-3000:]
        ),
    )
