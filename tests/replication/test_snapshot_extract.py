"""A standby installs a primary's copy on a Python without tar extraction filters.

The server image runs Debian bookworm's Python 3.11.2, whose ``TarFile.extractall``
takes no ``filter`` (added in 3.11.4): a re-copy there failed with a TypeError, so a
new, empty pod could never copy a primary's data and a scale-up under the operator
never reached sync (seen in e2e/test_operator_scaling.py with the pods as containers).
These tests make this interpreter look like that one (no ``tarfile.data_filter``, an
``extractall`` that refuses ``filter``) and install a copy, and check that the
by-hand checks refuse what the ``data`` filter refuses, before writing anything.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from stream_server.engine.snapshot import extract
from stream_server.replication.standby.snapshot_install import install


@pytest.fixture
def old_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile as Python 3.11.2 has it."""
    monkeypatch.delattr(tarfile, "data_filter")
    original = tarfile.TarFile.extractall

    def extractall(self: tarfile.TarFile, path: Any = ".", members: Any = None, **kw: Any) -> None:
        if kw:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kw))!r}")
        original(self, path, members)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def copy(path: Path, entries: list[tuple[str, bytes | None, bytes]]) -> Path:
    """A tar of (name, content or None for a directory, kind) entries."""
    with tarfile.open(path, "w") as tar:
        for name, content, kind in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            if content is not None:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return path


def test_a_copy_installs_without_extraction_filters(old_python: None, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "FORMAT").write_text("old\n")
    tar = copy(
        tmp_path / "copy.tar",
        [
            ("FORMAT", b"new\n", tarfile.REGTYPE),
            ("segments", None, tarfile.DIRTYPE),
            ("segments/s1", b"acknowledged", tarfile.REGTYPE),
        ],
    )
    install(data, tar)
    assert (data / "FORMAT").read_text() == "new\n"
    assert (data / "segments" / "s1").read_bytes() == b"acknowledged"
    assert (data / "wal").is_dir() and not tar.exists()


@pytest.mark.parametrize(
    "hostile",
    [
        ("../outside", b"x", tarfile.REGTYPE),
        ("/abs/outside", b"x", tarfile.REGTYPE),
        ("link", None, tarfile.SYMTYPE),
    ],
    ids=["parent", "absolute", "symlink"],
)
def test_without_filters_a_member_outside_or_not_a_file_refuses_the_copy(
    old_python: None, tmp_path: Path, hostile: tuple[str, bytes | None, bytes]
) -> None:
    tar = copy(tmp_path / "copy.tar", [("FORMAT", b"new\n", tarfile.REGTYPE), hostile])
    dest = tmp_path / "dest" / "fresh"
    dest.parent.mkdir()
    with tarfile.open(tar) as t, pytest.raises(tarfile.TarError):
        extract(t, dest)
    assert not dest.exists()  # nothing written
    assert not (tmp_path / "outside").exists()
