"""Shared test fixtures: real server processes on real ports with real data directories."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from testkit import summary
from testkit.servers import Child, env_with, free_port, http_status, stream_server_command
from testkit.stream_reads import read_all, read_served, stream_state

ROOT = Path(__file__).parent
# Marks a test's needs (programs, packages): skipped by hand, failed under make test;
# and refuses a process to a test whose module is not marked `processes` (the fast tier).
# testkit.asgi's fixtures start the server in-process (app_server, async_app_server).
pytest_plugins = ["testkit.needs", "testkit.tiers", "testkit.asgi"]

__all__ = [
    "ROOT",
    "ServerProcess",
    "free_port",
    "read_all",
    "read_served",
    "server_factory",
    "shared_server",
    "stream_state",
]


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
    def proc(self) -> subprocess.Popen | None:
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


@pytest.fixture
def server_factory(tmp_path):
    started: list[ServerProcess] = []

    def make(*args: str, data_dir: Path | None = None, env: dict | None = None) -> ServerProcess:
        srv = ServerProcess(data_dir or tmp_path / f"data{len(started)}", *args, env=env)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory) -> ServerProcess:
    """One server for a whole session, for tests that each use their own streams."""
    srv = ServerProcess(
        tmp_path_factory.mktemp("shared") / "data",
        "--long-poll-timeout",
        "2",
        "--sse-reconnect-interval",
        "3",
    ).start()
    yield srv
    srv.stop()


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


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        summary.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        summary.end()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
        return
    for section, lines in summary.sections().items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)
