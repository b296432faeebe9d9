"""The standby's writer thread (``replication/standby/applier.py``) on real engines and files:
each answer's frames durable before its commit, the commit held until the
acknowledgement has gone out (or ``SENT_WAIT``), answers applied in order, a failed
engine reported without a commit, and ``stop`` letting the job under way finish."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stream_format.records import KIND_BYTES
from stream_server.engine.storage_errors import StorageFailed
from stream_server.replication.standby import applier as applier_module
from stream_server.replication.standby.applier import Applier
from testkit.engines import crash
from testkit.replica_engines import primary_frames, standby


class WatchedSent(applier_module.Sent):
    """``Sent`` that tells the test when the writer thread has begun to wait on it."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float) -> bool:
        self.waiting.set()
        return super().wait(timeout)


async def test_the_commit_waits_for_the_acknowledgement_to_go_out(tmp_path, monkeypatch):
    monkeypatch.setattr(applier_module, "SENT_WAIT", 30.0)  # only ``sent`` may end the wait
    monkeypatch.setattr(applier_module, "Sent", WatchedSent)
    frames = primary_frames(tmp_path / "primary")
    e, hooks = standby(tmp_path / "standby")
    applier = Applier(e, hooks)
    job = applier.submit(frames)
    written = await job.written
    assert written is not None and hooks.durable == (2, 3)
    sent = job.sent
    assert isinstance(sent, WatchedSent)
    assert await asyncio.to_thread(sent.waiting.wait, 30.0)  # the writer thread waits on it
    assert not job.committed.done() and not e.tails  # held: the acknowledgement is not out
    job.sent.set()
    applied = await asyncio.wait_for(job.committed, 10)
    assert [lsn for lsn, _, _ in applied] == [1, 2, 3]
    assert e.tails[1].unit == len(b"hello world")
    await applier.stop()
    e.close()


async def test_answers_are_applied_in_order_and_stop_finishes_the_last(tmp_path, monkeypatch):
    monkeypatch.setattr(applier_module, "SENT_WAIT", 0.01)  # nobody sends: the wait ends
    frames = primary_frames(tmp_path / "primary")
    e, hooks = standby(tmp_path / "standby")
    applier = Applier(e, hooks)
    jobs = [applier.submit([f]) for f in frames]  # three answers queued at once
    await jobs[0].written
    await applier.stop()  # returns once every queued job has run
    assert all(j.committed.done() for j in jobs)
    assert [lsn for j in jobs for lsn, _, _ in j.committed.result()] == [1, 2, 3]
    got, _, _ = e.read(1, KIND_BYTES, 0, len(b"hello world"), 1 << 20, None)
    assert b"".join(got) == b"hello world"
    crash(e)


async def test_a_failed_engine_fails_the_write_and_commits_nothing(tmp_path):
    frames = primary_frames(tmp_path / "primary")
    e, hooks = standby(tmp_path / "standby")
    e._fail("disk gone (test)")
    applier = Applier(e, hooks)
    job = applier.submit(frames)
    with pytest.raises(StorageFailed):
        await job.written
    with pytest.raises(asyncio.CancelledError):
        await job.committed
    assert hooks.durable == (0, 0)
    await applier.stop()
    crash(e)
