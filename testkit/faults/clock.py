"""A slow (or fast) clock for one server process, with libfaketime (Debian's ``faketime``).

``slow_clock(rate)`` is the environment that makes every clock of a process
and its children run at ``rate`` times real time: ``time.time``,
``time.monotonic`` (``FAKETIME_DONT_FAKE_MONOTONIC=0``), and the waits
measured by them (``sleep``, asyncio's timers, socket timeouts). A server
under ``rate`` 0.5 renews its Lease every 2 * ``lease_retry_period`` of real
time and counts its ``lease_renew_deadline`` in half-speed seconds, so it may
believe itself primary after the others, with correct clocks, have taken over.

The library is preloaded (``LD_PRELOAD``), not run through the ``faketime``
wrapper, so the process is the server's own command (``ReplicaSet`` checks a
pid against it); the multi-threaded variant (``libfaketimeMT``) because the
server runs threads. ``measured_rate(env)`` runs a child Python under that
environment and compares its ``time.monotonic()`` against this process's: the
proof that the clock really runs slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

LIBRARIES = [
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"),
    Path("/usr/lib/faketime/libfaketimeMT.so.1"),
]


def library() -> Path | None:
    """libfaketime's multi-threaded library, where Debian's ``libfaketime`` puts it."""
    return next((p for p in LIBRARIES if p.exists()), None)


def slow_clock(rate: float) -> dict[str, str]:
    """Environment for a process whose clocks run at ``rate`` x real time from its start."""
    lib = library()
    if lib is None:
        raise RuntimeError("libfaketime is not installed (Debian's faketime: make system-deps)")
    return {
        "LD_PRELOAD": str(lib),
        "FAKETIME": f"+0 x{rate}",  # no offset, the rate from the process's start
        "FAKETIME_DONT_FAKE_MONOTONIC": "0",  # monotonic too: what leases are measured by
        "FAKETIME_NO_CACHE": "1",
    }


def measured_rate(env: dict[str, str], real_seconds: float = 1.0) -> float:
    """How fast ``time.monotonic()`` runs in a child under ``env``, against real time."""
    probe = (
        "import sys, time\n"
        "print(time.monotonic(), flush=True)\n"
        "sys.stdin.readline()\n"
        "print(time.monotonic(), flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", probe],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        first = float(child.stdout.readline())
        started = time.monotonic()
        time.sleep(real_seconds)
        child.stdin.write("\n")
        child.stdin.flush()
        second = float(child.stdout.readline())
        real = time.monotonic() - started
    finally:
        child.kill()
        child.wait()
    return (second - first) / real
