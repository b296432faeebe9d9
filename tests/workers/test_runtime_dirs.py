"""A writer killed -9 leaves its runtime directory (sockets, workers' metrics files) in
the temporary directory; the next writer's start removes those of writers that no
longer run, and never a running writer's. A writer restarted in place keeps its pid:
what its earlier image left is removed too."""

from __future__ import annotations

import os
from pathlib import Path

from stream_server.workers.processes import RUNTIME_PREFIX, remove_stale_runtimes


def test_only_the_directories_of_writers_that_no_longer_run_are_removed(tmp_path: Path):
    beyond = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it
    dead = tmp_path / f"{RUNTIME_PREFIX}{beyond}-abc"
    earlier_image = tmp_path / f"{RUNTIME_PREFIX}{os.getpid()}-def"  # before this start
    init = tmp_path / f"{RUNTIME_PREFIX}1-ghi"  # pid 1 always runs
    other = tmp_path / "ds-writer-nopid"
    for d in (dead, earlier_image, init, other):
        (d / "metrics").mkdir(parents=True)
    remove_stale_runtimes(tmp_path)
    assert not dead.exists() and not earlier_image.exists()
    assert init.exists() and other.exists()
