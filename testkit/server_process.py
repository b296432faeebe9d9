"""A server child process for the tests, and what only a real socket can ask of it.

``ServerProcess`` is ``durable-streams-server serve`` on a free port and a
data directory of the test's (on ``testkit.servers.Child``); the root
conftest's ``server_factory`` and ``shared_server`` fixtures make them.
``raw_get`` and ``read_until_closed`` speak HTTP on a raw socket, for what a
client library would hide (a response left unread, a small receive buffer,
a connection the server closes); ``live_gauge`` reads the live-readers gauge
a process exports. Tests that need none of this run the app in-process
(``testkit.asgi``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
from pathlib import Path

import httpx

from testkit.servers import Child, env_with, free_port, http_status, stream_server_command

__all__ = ["ServerProcess", "live_gauge", "raw_get", "read_until_closed"]


class ServerProcess:
    """A ``durable-streams-server serve`` child process (on ``testkit.servers.Child``)."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.env = env or {}
        self.port = free_port()
        self.scheme = "http"
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.url}/v1/stream/"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.proc if self.child else None

    def start(self, *, timeout: float = 30.0) -> ServerProcess:
        self.child = Child(
            "server",
            stream_server_command(self.port, self.data_dir, *self.args),
            self.log_path,
            env=env_with(self.env),
        )
        tls = self.scheme == "https"
        self.child.start(
            lambda: http_status(self.port, "/readyz", tls=tls, timeout=1) == 200, timeout=timeout
        )
        return self

    def log(self) -> str:
        return self.child.log_tail() if self.child else ""

    def kill(self) -> None:
        """SIGKILL: the crash the durability promise is about."""
        if self.child:
            self.child.kill()

    def stop(self) -> int:
        return self.child.stop(timeout=20) if self.child else 0


def worker_pids(srv: ServerProcess) -> list[int]:
    """The pids of a server's worker processes (``--workers N``): its living children."""
    if srv.proc is None:
        return []
    return children_of(srv.proc.pid)


def children_of(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    return process_state(pid) not in (None, "Z")


def process_state(pid: int) -> str | None:
    """A process's state letter (R, S, T stopped, Z zombie, ...); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def live_gauge(srv: ServerProcess, mode: str) -> float:
    """The server's live-readers gauge for ``mode`` (long-poll or sse), from /metrics."""
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    m = re.search(rf'durable_streams_live_readers{{mode="{mode}"}} ([0-9.e+]+)', text)
    assert m, text[:2000]
    return float(m.group(1))


def raw_get(
    port: int, target: str, *, rcvbuf: int | None = None, timeout: float | None = None
) -> socket.socket:
    """A GET sent on a raw socket, left for the test to read (or never to)."""
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the socket times out)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    finally:
        s.close()
    return out


def connections_held(pid: int, port: int) -> int:
    """How many established TCP connections to ``port`` process ``pid`` holds (which
    worker of ``--workers N`` the kernel gave a client's connection to)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    held = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "01" and fields[9] in inodes:
                    held += 1
    return held
