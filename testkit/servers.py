"""Server child processes for the tests and the benchmark: one way to start, probe and stop them.

``testkit.server_process.ServerProcess`` (the tests' server), the benchmark's servers
(``e2e/bench/servers.py``: ours, a baseline checkout, the Node reference,
the HTTP ceiling) and the Spark read benchmark all build on ``Child``.
Nothing here imports pytest or an HTTP library, so the benchmark can use it
as a plain script.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(
    port: int,
    path: str = "/readyz",
    *,
    tls: bool = False,
    timeout: float = 2.0,
    host: str = "127.0.0.1",
) -> int | None:
    """The status of ``GET path`` on host:port (default 127.0.0.1), or None when nothing answers.

    Raw socket, one request, ``Connection: close``; with ``tls`` the
    certificate is not checked (a readiness probe, not a client).
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock: socket.socket = raw
            if tls:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                sock = ctx.wrap_socket(raw, server_hostname=host)
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode()
            )
            line = sock.recv(64)
            return int(line.split(b" ", 2)[1]) if line.startswith(b"HTTP/") else None
    except (OSError, ValueError, IndexError):
        return None


def stream_server_command(port: int, data_dir: Path, *args: str) -> list[str]:
    """``python -m stream_server serve`` on ``port`` and ``data_dir``, then ``args``."""
    return [
        sys.executable,
        "-m",
        "stream_server",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *args,
    ]


_LIBC: ctypes.CDLL | None = None
with contextlib.suppress(OSError):
    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here, not in the forked child


def die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies, even by SIGKILL (no orphans)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cpu_seconds(pid: int, *, thread: int | None = None, kernel: bool = False) -> float:
    """CPU time a process has used so far, user and system (0 when it cannot be read);
    with ``thread``, that one of its threads' alone (the main thread's id is the pid);
    with ``kernel``, the system part alone (its system calls, its page faults)."""
    stat = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[12]) if kernel else int(fields[11]) + int(fields[12])  # stime, utime
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int, *, children: bool = False) -> int:
    """A process's resident set size (VmRSS), 0 when it cannot be read; with
    ``children``, its descendants' too (the server's JSON worker, say)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total = int(line.split()[1]) * 1024
        if children:
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                total += rss_bytes(int(child), children=True)
    except OSError:
        pass
    return total


class Child:
    """One child process whose output goes to a log file, started and waited for until ready.

    ``ready`` is asked every ``poll`` seconds until it returns True; a child
    that exits first, or is not ready in time, raises RuntimeError with the
    end of its log. ``orphan_safe`` children get SIGTERM when this process
    dies (the benchmark, a single-threaded script, asks for it; the tests
    do not: pytest may have threads when it forks).
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        orphan_safe: bool = False,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = Path(log_path)
        self.env = env  # the whole environment; None: this process's
        self.cwd = cwd
        self.orphan_safe = orphan_safe  # SIGTERM the child when this process dies
        self.proc: subprocess.Popen | None = None

    def start(
        self, ready: Callable[[], bool], *, timeout: float = 30.0, poll: float = 0.05
    ) -> float:
        """Spawn the process and wait until ``ready()``; return the seconds that took."""
        with open(self.log_path, "ab") as log:
            started = time.monotonic()
            self.proc = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=die_with_parent if self.orphan_safe else None,
            )
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} at start:\n{self.log_tail()}"
                )
            if ready():
                return time.monotonic() - started
            time.sleep(poll)
        raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def rss(self) -> int:
        return rss_bytes(self.proc.pid) if self.running and self.proc else 0

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit status (0 if never started)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else 0


def env_with(extra: dict[str, str] | None = None, *, pythonpath: Path | None = None) -> dict:
    """This process's environment, plus ``extra``, with ``pythonpath`` first on PYTHONPATH."""
    env = {**os.environ, **(extra or {})}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p
        )
    return env
