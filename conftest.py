"""Shared test fixtures: real server processes on real ports with real data directories."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from testkit import free_port

ROOT = Path(__file__).parent


class ServerProcess:
    """A ``durable-streams-server serve`` child process."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.env = env or {}
        self.port = free_port()
        self.scheme = "http"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.url}/v1/stream/"

    def start(self, *, timeout: float = 30.0) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "stream_server",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1, verify=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout}s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the crash the durability promise is about."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else 0


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


def read_all(url: str, *, timeout: float = 10) -> bytes:
    """A stream's whole content, following Stream-Next-Offset until up to date."""
    out, offset = b"", "-1"
    with httpx.Client(timeout=timeout) as c:
        while True:
            r = c.get(url, params={"offset": offset})
            assert r.status_code == 200, (url, r.status_code, r.text)
            out += r.content
            offset = r.headers["stream-next-offset"]
            if r.headers.get("stream-up-to-date") == "true":
                return out


def stream_state(url: str) -> tuple:
    """Everything a client can observe of a stream: status, tail, closure, content hash."""
    h = httpx.head(url, timeout=10)
    body = read_all(url) if h.status_code == 200 else b""
    return (
        h.status_code,
        h.headers.get("stream-next-offset"),
        h.headers.get("stream-closed"),
        hashlib.sha256(body).hexdigest(),
    )
