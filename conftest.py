"""Shared test fixtures: real server processes on real ports with real data directories
(``server_factory``, ``shared_server``), and in-process servers (``testkit.asgi``'s).

The helpers test modules used to import from here live in testkit
(``testkit.server_process``, ``testkit.stream_reads``); they are still
importable from here for the modules not moved yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import summary
from testkit.server_process import ServerProcess, live_gauge, raw_get, read_until_closed
from testkit.servers import free_port
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
    "live_gauge",
    "raw_get",
    "read_all",
    "read_served",
    "read_until_closed",
    "server_factory",
    "shared_server",
    "stream_state",
]


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
