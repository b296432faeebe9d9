"""Data formats on real directories: format 1 (headerless WAL files) and format 2 (no
records database) directories still open, are replayed and raised to the current
format; WAL files recovery cannot replay stop the server."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import lmdb
import pytest

from stream_format import wal
from stream_format.layout import CURRENT, DataFormat, Layout
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine, LayoutError
from stream_server.engine.data_dir import prepare
from stream_server.engine.ops import Append, PutKeyedValue
from testkit.engines import crash, new_stream, read_all

pytestmark = pytest.mark.processes

V1_FORMAT = "durable-streams-py data format 1\n"
V2_FORMAT = "durable-streams-py data format 2\nread-version 1\n"


def crashed_directory(root, *, data: bytes = b"durable") -> Layout:
    """A directory whose acknowledged writes live only in its WAL (segment bytes lost).
    Every log in a file, as formats 1 to 4 keep them."""
    e = Engine(root, inline_max=0)
    e.open()
    new_stream(e, "a", 1)
    e.commit([Append(1, KIND_BYTES, [data])])
    seg = e.layout.segment_path(1)
    crash(e)
    os.truncate(seg, 0)  # as if the page cache never reached the disk
    return Layout(root)


def as_format_1(layout: Layout) -> None:
    """Turn a crashed directory into what a format-1 server leaves: frames are the same
    bytes in both formats; format 1 has no WAL file header and a one-line FORMAT."""
    layout.version_file.write_text(V1_FORMAT)
    for path in wal.wal_files(layout.wal):
        raw = path.read_bytes()
        assert raw[: wal.HEADER_SIZE] == wal.encode_header(wal.file_number(path))
        path.write_bytes(raw[wal.HEADER_SIZE :])


def test_a_new_directory_is_written_in_the_current_format(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    assert e.layout.version_file.read_text() == CURRENT.text()
    (path,) = wal.wal_files(e.layout.wal)
    assert path.read_bytes() == wal.encode_header(wal.file_number(path))
    e.close()


def test_a_format_1_directory_with_a_headerless_wal_is_replayed_and_raised(tmp_path):
    layout = crashed_directory(tmp_path / "d")
    as_format_1(layout)
    assert prepare(layout) == DataFormat(1, 1)  # readable and writable as it is
    e = Engine(layout.root)
    _, report = e.open()
    assert report.wal_frames_replayed == 2
    assert read_all(e, 1, KIND_BYTES, 0, 7) == b"durable"
    # Raised once the old WAL was replayed and deleted: the new WAL has a header.
    assert layout.version_file.read_text() == CURRENT.text()
    (path,) = wal.wal_files(layout.wal)
    assert path.read_bytes()[: wal.HEADER_SIZE] == wal.encode_header(wal.file_number(path))
    e.commit([Append(1, KIND_BYTES, [b"!"])])
    crash(e)
    e2 = Engine(layout.root)
    e2.open()
    assert read_all(e2, 1, KIND_BYTES, 0, 8) == b"durable!"
    e2.close()


def as_format_2(layout: Layout) -> None:
    """Turn a crashed directory into what a format-2 server leaves: the same WAL files
    and LMDB, without the records database (format 3 added it) and the inline one
    (format 5)."""
    layout.version_file.write_text(V2_FORMAT)
    env = lmdb.open(str(layout.meta), max_dbs=8)
    with env.begin(write=True) as txn:
        for name in (b"records", b"inline"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
    with env.begin() as txn:
        assert txn.get(b"records") is None and txn.get(b"inline") is None
    env.close()


def test_a_format_2_directory_is_replayed_and_raised_to_format_3(tmp_path):
    layout = crashed_directory(tmp_path / "d")
    as_format_2(layout)
    assert prepare(layout) == DataFormat(2, 1)
    e = Engine(layout.root)
    _, report = e.open()
    assert report.wal_frames_replayed == 2
    assert read_all(e, 1, KIND_BYTES, 0, 7) == b"durable"
    assert (
        layout.version_file.read_text()
        == CURRENT.text()
        == ("durable-streams-py data format 5\nread-version 3\n")
    )
    assert e.keyed_values("subs") == {}
    e.commit([PutKeyedValue("subs", "a", b"1")])
    crash(e)
    e2 = Engine(layout.root)
    e2.open()
    assert e2.keyed_values("subs") == {"a": b"1"}
    e2.close()


def test_a_leftover_version_file_copy_from_an_interrupted_upgrade_is_removed(tmp_path):
    layout = crashed_directory(tmp_path / "d")
    as_format_1(layout)
    (layout.root / "FORMAT.tmp").write_text(CURRENT.text())  # its rename never happened
    e = Engine(layout.root)
    e.open()
    assert read_all(e, 1, KIND_BYTES, 0, 7) == b"durable"
    assert not (layout.root / "FORMAT.tmp").exists()
    e.close()


def _damage(layout: Layout, how: str) -> str:
    (path,) = wal.wal_files(layout.wal)
    raw = bytearray(path.read_bytes())
    if how == "magic":
        raw[:6] = b"NOTWAL"
        expect = "not a WAL file"
    elif how == "version":
        raw[6:8] = (3).to_bytes(2, "little")
        expect = "WAL file version 3 is newer than"
    elif how == "headerless":
        raw = raw[wal.HEADER_SIZE :]
        expect = "a headerless WAL file of data format 1 in a directory of format 2 or later"
    else:
        layout.version_file.write_text(V1_FORMAT)
        expect = "a WAL file with a format-2 header in a format-1 directory"
    path.write_bytes(bytes(raw))
    return f"{path}: {expect}"


@pytest.mark.parametrize("how", ["magic", "version", "headerless", "header-in-v1"])
def test_a_wal_file_recovery_cannot_replay_stops_the_start(tmp_path, how):
    layout = crashed_directory(tmp_path / "d")
    message = _damage(layout, how)
    with pytest.raises(LayoutError, match=re.escape(message)):
        prepare(layout)
    e = Engine(layout.root)
    with pytest.raises(LayoutError, match="WAL file"):
        e.open()


def test_the_server_refuses_to_start_naming_the_wal_file(tmp_path):
    layout = crashed_directory(tmp_path / "d")
    message = _damage(layout, "version")
    proc = subprocess.run(
        [sys.executable, "-m", "stream_server", "serve", "--data-dir", str(layout.root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DS_PORT": "0"},
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr + proc.stdout
