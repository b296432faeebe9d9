"""Where a command's CPU goes, by kind of process: the command and every process it
starts, sampled from /proc while it runs.

    python e2e/cpu_by_process.py -- python -m pytest -q e2e/test_operator_scaling.py

prints the wall time, how busy the machine was, and the CPU seconds of each kind of
process (the servers, the emulated API server, the pytest process, podman, Java...),
largest first. The suite is bound by the CPU of two cores: this is how the emulated API
server's request-history scan was found (91 of 170 CPU seconds of one operator
scaling scenario). A process is counted when it descends from the command; one that
lives less than a sample interval (0.25 s) is missed, and a process re-parented away
(a daemon) is no longer followed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
# The kinds named in the table, by what their command line holds, first match wins.
KINDS = (
    "stream_server",
    "testkit.kube_serve",
    "stream_operator",
    "pytest",
    "node",
    "podman",
    "conmon",
    "weed",
    "prometheus",
    "java",
    "helm",
    "kubectl",
)

Process = tuple[float, str, int]  # CPU seconds, command line, parent pid


def processes() -> dict[int, Process]:
    """Every process's CPU time so far, command line and parent."""
    found: dict[int, Process] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        found[int(entry.name)] = (
            (int(fields[11]) + int(fields[12])) / TICK,
            command,
            int(fields[1]),
        )
    return found


def descendants(root: int, table: dict[int, Process]) -> set[int]:
    """``root`` and every process below it."""
    ours = {root}
    grew = True
    while grew:
        grew = False
        for pid, (_, _, parent) in table.items():
            if parent in ours and pid not in ours:
                ours.add(pid)
                grew = True
    return ours


def kind(command: str) -> str:
    return next((k for k in KINDS if k in command), command[:60] or "(exited)")


def busy_ticks() -> tuple[int, int]:
    """The machine's busy and total CPU ticks so far (/proc/stat's first line)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] or parser.error("no command")
    started, (busy0, total0) = time.monotonic(), busy_ticks()
    proc = subprocess.Popen(command)
    # pid -> its CPU and command line, the last seen; an exited process (a zombie until
    # reaped) shows no command line, so it keeps the one it had.
    most: dict[int, tuple[float, str]] = {}
    while proc.poll() is None:
        table = processes()
        for pid in descendants(proc.pid, table):
            if pid in table:
                cpu, line, _ = table[pid]
                before, known = most.get(pid, (0.0, ""))
                most[pid] = (max(cpu, before), line or known)
        time.sleep(0.25)
    busy1, total1 = busy_ticks()
    by_kind: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for cpu, line in most.values():
        by_kind[kind(line)] += cpu
        count[kind(line)] += 1
    print(
        f"wall {time.monotonic() - started:.1f} s, machine busy "
        f"{100 * (busy1 - busy0) / max(1, total1 - total0):.0f}%, "
        f"CPU {sum(by_kind.values()):.1f} s"
    )
    for name, cpu in by_kind.most_common():
        print(f"{cpu:8.1f} s  {count[name]:4d} processes  {name}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
