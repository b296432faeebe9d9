"""The recorded order of the engine's file-system calls is the order the disk saw.

The crash-state explorer rebuilds every state from that log. When a checkpoint
thread flushed a segment file by name while the commit thread unlinked it, the
flush could be noted after the unlink though it ran before: the explorer then
met a flush of a name that no longer existed (seen once in CI, a KeyError in
``test_crash_states``). Here the other thread's unlink is started at the
moment the flush is being noted, and must be logged after it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from stream_server.engine import fsio


class _UnlinkDuringFlushNote:
    """Starts an unlink of the flushed file from another thread while the flush is
    being noted, and gives it time to run before letting the note through."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.lock = threading.Lock()
        self.racer: threading.Thread | None = None

    def record(self, op: tuple) -> None:
        if op[0] == "fsync" and self.racer is None:
            self.racer = threading.Thread(target=fsio.unlink, args=(Path(op[1]),))
            self.racer.start()
            self.racer.join(timeout=0.5)  # without ordering, the unlink is noted by now
        with self.lock:
            self.ops.append(op[:2])


def test_a_flush_by_name_is_noted_before_an_unlink_from_another_thread(tmp_path):
    path = tmp_path / "segment.log"
    path.write_bytes(b"x")
    recorder = _UnlinkDuringFlushNote()
    fsio.attach(recorder)
    try:
        assert fsio.fdatasync_path(path)
        assert recorder.racer is not None
        recorder.racer.join()
    finally:
        fsio.attach(None)
    assert recorder.ops == [("fsync", str(path)), ("unlink", str(path))]
    assert not path.exists()


def test_a_write_by_descriptor_is_noted_before_an_unlink_from_another_thread(tmp_path):
    path = tmp_path / "segment.log"
    recorder = _UnlinkDuringFlushNote()
    fsio.attach(recorder)
    try:
        fd = fsio.open_write(path)
        fsio.pwrite(fd, b"abc", 0)
        fsio.fdatasync(fd)
        fsio.close(fd)
        assert recorder.racer is not None
        recorder.racer.join()
    finally:
        fsio.attach(None)
    kinds = [op[0] for op in recorder.ops]
    assert kinds == ["create", "write", "fsync", "unlink"]
