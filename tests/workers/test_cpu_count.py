"""``--workers 0``: one worker per CPU the process may use, the cgroup's quota (a pod's CPU
limit) first, rounded up as Kubernetes rounds a ``resourceFieldRef`` of ``limits.cpu``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stream_server.workers import supervisor
from stream_server.workers.supervisor import _cgroup_quota, cpu_count


@pytest.mark.parametrize(
    ("cpu_max", "cpus"),
    [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1), ("400000 100000", 4)],
)
def test_the_quota_in_whole_cpus(tmp_path: Path, cpu_max: str, cpus: int | None):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert _cgroup_quota(path) == cpus


def test_no_cgroup_file_is_no_quota(tmp_path: Path):
    assert _cgroup_quota(tmp_path / "missing") is None


def test_the_quota_caps_the_cpus_the_process_may_run_on(monkeypatch):
    allowed = len(os.sched_getaffinity(0))
    monkeypatch.setattr(supervisor, "_cgroup_quota", lambda _: 1)
    assert cpu_count() == 1
    monkeypatch.setattr(supervisor, "_cgroup_quota", lambda _: None)
    assert cpu_count() == allowed
    monkeypatch.setattr(supervisor, "_cgroup_quota", lambda _: allowed + 8)
    assert cpu_count() == allowed  # a quota above the CPUs it may run on buys nothing
