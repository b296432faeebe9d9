"""What a replica cluster's server tells of itself (``ArchiveFollower.status``, shown by
``GET /_archive/status``): role ``following``, the lsn applied, the lag, and a damaged
archive object named in ``last_error`` while it applies nothing past it. The app runs
in-process (``testkit.asgi``) on a real store; its first start on a prepared but empty
data directory counts as empty (a base backup would be restored into it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stream_format.archive import wal_name
from stream_format.layout import Layout
from stream_server.archive.follow.follow_bootstrap import is_empty
from stream_server.archive.upload import archive_end
from stream_server.engine import Engine
from stream_server.engine.data_dir import prepare
from testkit import wait_for
from testkit.archive_follow import OCTET, POLL
from testkit.archive_frames import wal_frames
from testkit.archive_store import S3Store, object_store, server_args
from testkit.asgi import in_thread

pytestmark = pytest.mark.processes


def test_status_and_a_damaged_object(
    tmp_path: Path, archive_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = object_store(archive_store, archive_store.new_bucket())
    with in_thread(tmp_path / "source") as src:
        assert src.http is not None
        src.http.put(f"{src.base}s", content=b"abc", headers=OCTET)
        src.http.post(f"{src.base}s", content=b"def", headers=OCTET)
        frames = wal_frames(src.data_dir / "wal")
    archive_end.put_history(objects, [(0, 1)], 0)
    archive_end.put_frames(objects, 0, frames)
    last = frames[-1].lsn

    for key, value in archive_store.env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    flags = ["--archive-follow", "true", *server_args(archive_store, objects.url)]
    with in_thread(tmp_path / "follower", *flags, "--archive-timeout", POLL) as fol:
        follower = fol.app.follower
        assert follower is not None
        wait_for(lambda: follower.status()["applied_lsn"] == last)
        status = follower.status()
        assert status["role"] == "following"
        assert status["url"] == objects.url
        assert status["lag_seconds"] == 0.0
        assert status["failing"] is False
        assert status["last_applied_at"] == pytest.approx(frames[-1].time_us / 1e6)

        damaged = wal_name(0, last + 1)
        assert objects.put_new(damaged, b"DSARCWAL" + b"\0" * 60)
        wait_for(lambda: follower.status()["failing"])
        status = follower.status()
        assert damaged in str(status["last_error"]), status
        assert status["applied_lsn"] == last
        assert time.time() - float(status["last_applied_at"] or 0) >= 0


def test_a_first_start_counts_a_prepared_directory_as_empty(tmp_path: Path) -> None:
    assert is_empty(tmp_path / "none")
    data = tmp_path / "data"
    prepare(Layout(data))  # what serve() makes first: the version file, meta/, wal/, segments/
    assert is_empty(data)
    engine = Engine(data)
    engine.open()
    engine.close()
    assert not is_empty(data)  # LMDB's files are data (an empty store, but a store)
