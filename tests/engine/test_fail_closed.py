"""The engine's fail-closed state alone (``engine/fail_closed.py``): one object every
writing part shares, so that a failure one part sees stops the others."""

from __future__ import annotations

import pytest

from stream_server.engine.fail_closed import FailClosed
from stream_server.engine.storage_errors import StorageFailed


def test_a_fresh_state_lets_writes_through():
    faults = FailClosed()
    faults.refuse_when_failed()  # nothing raised
    assert faults.failed is None


def test_once_failed_every_write_is_refused_with_the_first_reason():
    faults = FailClosed()
    faults.fail("WAL fdatasync failed: EIO")
    faults.fail("checkpoint flush failed: EIO")  # a consequence: the cause stays
    assert faults.failed == "WAL fdatasync failed: EIO"
    with pytest.raises(StorageFailed, match="WAL fdatasync failed: EIO"):
        faults.refuse_when_failed()
    assert "WAL fdatasync failed" in str(faults.error())


def test_the_fault_hook_hears_each_stage_and_may_be_set_later():
    faults = FailClosed()
    faults.hook("segments")  # no hook: nothing happens
    stages: list[str] = []
    faults.fault_hook = stages.append
    faults.hook("fsync")
    faults.hook("commit")
    assert stages == ["fsync", "commit"]
