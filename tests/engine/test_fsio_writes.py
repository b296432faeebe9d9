"""A positional write the kernel takes in part is finished by the engine, not lost.

``fsio.pwrite`` makes one call for the common write and only builds a view of the
rest when the kernel took less (a signal, say):
here the kernel is made to take at most a few bytes a call.
"""

from __future__ import annotations

import os

from stream_server.engine import fsio


def test_a_write_taken_a_few_bytes_at_a_time_lands_whole(tmp_path, monkeypatch):
    path = tmp_path / "f"
    fd = fsio.open_write(path)
    real = os.pwrite
    calls = []

    def grudging(fd: int, data: bytes | memoryview, pos: int) -> int:
        calls.append(pos)
        return real(fd, bytes(data[:3]), pos)

    monkeypatch.setattr(os, "pwrite", grudging)
    try:
        fsio.pwrite(fd, b"0123456789", 5)
    finally:
        monkeypatch.undo()
        fsio.close(fd)
    assert path.read_bytes() == b"\0" * 5 + b"0123456789"
    assert calls == [5, 8, 11, 14]
