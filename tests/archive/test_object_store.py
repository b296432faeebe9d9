"""The archive's object store against a real S3-compatible store (SeaweedFS): written
once, never replaced; errors sorted into what the archiver does about them."""

from __future__ import annotations

import threading

import pytest

from stream_server.archive.object_store import (
    ArchiveDenied,
    ArchiveMissing,
    ArchiveUnavailable,
    ObjectStore,
)
from stream_server.declared.groups import ArchiveSettings
from testkit.archive_store import S3Store

pytestmark = pytest.mark.processes


@pytest.fixture
def store(archive_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for key, value in archive_store.env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    return ObjectStore(
        ArchiveSettings(
            archive_url=archive_store.new_bucket() + "/some/prefix",
            archive_endpoint=archive_store.endpoint,
        )
    )


def test_an_object_is_written_once_and_never_replaced(store: ObjectStore) -> None:
    assert store.put_new("wal/a", b"first")
    assert not store.put_new("wal/a", b"second")
    assert store.get("wal/a") == b"first"
    assert store.get_range("wal/a", 1, 3) == b"irs"
    assert store.size("wal/a") == 5


def test_one_writer_wins_a_race_for_a_name(store: ObjectStore) -> None:
    won: list[int] = []
    start = threading.Barrier(8)

    def write(i: int) -> None:
        start.wait()
        if store.put_new("wal/race", str(i).encode()):
            won.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert store.get("wal/race") == str(won[0]).encode()


def test_listing_is_in_name_order_below_the_prefix(store: ObjectStore) -> None:
    names = [f"wal/{i:016x}-{i:016x}" for i in (3, 1, 2, 0x20)]
    for name in names:
        store.put_new(name, b"x")
    store.put_new("history/0000000000000001.json", b"{}")
    assert [n for n, _ in store.objects("wal/")] == sorted(names)
    assert [n for n, _ in store.objects("wal/", start_after=sorted(names)[1])] == sorted(names)[2:]
    store.delete([sorted(names)[0], "wal/never-there"])
    assert len(list(store.objects("wal/"))) == 3
    assert {n for n, _ in store.objects("")} >= {"history/0000000000000001.json"}


def test_a_missing_object_is_missing(store: ObjectStore) -> None:
    with pytest.raises(ArchiveMissing, match="wal/nothing"):
        store.get("wal/nothing")


def test_wrong_credentials_are_denied_without_showing_them(
    archive_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in archive_store.env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    store = ObjectStore(
        ArchiveSettings(
            archive_url=archive_store.new_bucket(), archive_endpoint=archive_store.endpoint
        )
    )
    with pytest.raises(ArchiveDenied) as caught:
        store.put_new("x", b"1")
    assert "not-the-secret-at-all" not in str(caught.value)


def test_a_store_that_does_not_answer_is_unavailable(store: ObjectStore) -> None:
    gone = ObjectStore(
        ArchiveSettings(archive_url=store.url, archive_endpoint="http://127.0.0.1:9"),
        connect_timeout=1,
    )
    with pytest.raises(ArchiveUnavailable, match="reading wal/a"):
        gone.get("wal/a")
