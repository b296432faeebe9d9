"""Base backups against a real server and a real SeaweedFS: ``durable-streams-server backup``
asks the server (``POST /_archive/backups``), the parts and then the manifest are in
the bucket, ``backups list`` and ``GET /_archive/backups`` print the same catalog, and
the endpoint's refusals (no archive, no token)."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from stream_format.archive import decode_manifest, manifest_name
from stream_format.layout import CURRENT
from stream_format.records import crc32
from testkit import wait_for
from testkit.archive_frames import run_command, store_for
from testkit.archive_store import S3Store
from testkit.stream_kinds import StreamKinds

pytestmark = pytest.mark.processes


def archive_args(url: str, archive_store: S3Store) -> list[str]:
    return ["--archive-url", url, "--archive-endpoint", archive_store.endpoint]


def test_a_backup_is_uploaded_parts_first_and_listed(
    server_factory, archive_store, monkeypatch, tmp_path
) -> None:
    url = archive_store.new_bucket() + "/site-a"
    env = archive_store.env()
    srv = server_factory(*archive_args(url, archive_store), env=env).start()
    kinds = StreamKinds()
    with httpx.Client(timeout=10) as c:
        for _ in range(2):
            kinds.write_round(c, srv.url)
        # One log too long for LMDB (data format 5 keeps the short ones there).
        big = f"{srv.url}/v1/stream/big"
        octet = {"content-type": "application/octet-stream"}
        assert c.put(big, headers=octet).status_code == 201
        assert c.post(big, content=b"b" * 4096, headers=octet).status_code == 204
    code, done = run_command("backup", "--server", srv.url, env=env)
    assert code == 0, done
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{16}", done["id"])
    assert done["term"] == 0 and 0 <= done["start_lsn"] <= done["end_lsn"]
    assert done["end_lsn"] >= 10 and done["bytes"] > 0 and done["node"]

    store = store_for(archive_store, url, monkeypatch)
    manifest = decode_manifest("m", store.get(manifest_name(done["id"])))
    assert manifest["data_format"] == CURRENT.write and manifest["set"] == ""
    for part in manifest["parts"]:
        data = store.get(part["name"])
        assert (len(data), crc32(data)) == (part["size"], part["crc32"])
    files = {f["path"]: f for f in manifest["files"]}
    assert {"FORMAT", "meta/data.mdb"} <= set(files)
    fmt = (srv.data_dir / "FORMAT").read_bytes()
    assert (files["FORMAT"]["size"], files["FORMAT"]["crc32"]) == (len(fmt), crc32(fmt))
    # Every segment file (streams whose log outgrew LMDB, data format 5), and no other.
    on_disk = {str(p.relative_to(srv.data_dir)) for p in srv.data_dir.glob("segments/*/*.log")}
    assert on_disk and {p for p in files if p.startswith("segments/")} == on_disk

    code, listed = run_command("backups", "list", *archive_args(url, archive_store), env=env)
    assert code == 0, listed
    assert listed["backups"] == [{k: v for k, v in done.items() if k != "retention"}]
    assert listed["recoverable"]["first_lsn"] == done["end_lsn"]
    assert listed["recoverable"]["last_lsn"] >= done["end_lsn"]
    served = httpx.get(f"{srv.url}/_archive/backups", timeout=10)
    assert served.status_code == 200 and served.json() == listed


def test_the_variables_give_the_archive_too(archive_store, tmp_path) -> None:
    url = archive_store.new_bucket()
    env = archive_store.env(DS_ARCHIVE_URL=url, DS_ARCHIVE_ENDPOINT=archive_store.endpoint)
    code, listed = run_command("backups", "list", env=env)
    assert (code, listed) == (
        0,
        {"backups": [], "recoverable": None, "intervals": [], "gaps": [], "damaged": [],
         "unrestorable": [], "unfinished": []},
    )  # fmt: skip
    code, done = run_command("restore", "--data-dir", str(tmp_path / "d"), env=env)
    assert code == 1 and "no finished backup" in done["error"]


def test_without_an_archive_a_backup_is_refused(server_factory) -> None:
    srv = server_factory().start()
    r = httpx.post(f"{srv.url}/_archive/backups", timeout=10)
    assert r.status_code == 409 and "archive" in r.json()["error"]
    code, done = run_command("backup", "--server", srv.url, env={})
    assert code == 1 and "409" in done["error"]


def test_with_a_token_file_a_backup_needs_the_token(
    server_factory, archive_store, tmp_path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = archive_store.new_bucket()
    env = archive_store.env()
    args = [*archive_args(url, archive_store), "--replication-token-file", str(token)]
    srv = server_factory(*args, env=env).start()
    assert httpx.post(f"{srv.url}/_archive/backups", timeout=10).status_code == 401
    assert httpx.get(f"{srv.url}/_archive/backups", timeout=10).status_code == 401
    code, done = run_command("backup", "--server", srv.url, env=env)
    assert code == 1 and "401" in done["error"]
    code, done = run_command("backup", "--server", srv.url, "--token-file", str(token), env=env)
    assert code == 0, done


def test_a_store_that_refuses_gives_503_with_its_message(server_factory, archive_store) -> None:
    url = archive_store.new_bucket()
    env = archive_store.env(AWS_SECRET_ACCESS_KEY="not-the-secret")
    srv = server_factory(*archive_args(url, archive_store), env=env).start()
    r = httpx.post(f"{srv.url}/_archive/backups", timeout=30)
    assert r.status_code == 503, r.text
    assert "SignatureDoesNotMatch" in r.json()["error"]
    assert "not-the-secret" not in r.text


def test_the_newest_backups_time_is_a_metric(server_factory, archive_store) -> None:
    """What the "last backup too old" alert reads: 0 before any backup, then the newest
    backup's time, on the server that took it (and, within minutes, on any archiving
    server of the archive)."""
    url = archive_store.new_bucket() + "/metric"
    srv = server_factory(*archive_args(url, archive_store), env=archive_store.env()).start()

    def newest() -> float:
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        m = re.search(r"^durable_streams_archive_last_backup_timestamp_seconds (\S+)$", text, re.M)
        assert m, text[-3000:]
        return float(m.group(1))

    assert newest() == 0
    before = time.time()
    taken = httpx.post(f"{srv.url}/_archive/backups", timeout=60)
    assert taken.status_code == 201, taken.text
    wait_for(lambda: newest() > 0, timeout=30, message="the newest backup's time in /metrics")
    assert before - 1 <= newest() <= time.time()
