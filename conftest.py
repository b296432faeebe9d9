"""Shared test fixtures: real server processes on real ports with real data directories
(``server_factory``, ``shared_server``), and in-process servers (``testkit.asgi``'s).

Fixtures only: what test modules import lives in testkit (``testkit.server_process``,
``testkit.stream_reads``, ...); no test module imports a conftest
(tests/test_layout_of_tests.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit import summary
from testkit.server_process import ServerProcess

# Marks a test's needs (programs, packages): skipped by hand, failed under make test;
# and refuses a process to a test whose module is not marked `processes` (the fast tier).
# testkit.asgi's fixtures start the server in-process (app_server, async_app_server).
# testkit.archive_store: `archive_store`, a real S3-compatible store per module (SeaweedFS, or
# Ceph RGW with ARCHIVE_STORE=ceph), and `seaweed` (testkit.seaweedfs).
# testkit.module_leaks fails a test that leaves a product function replaced.
# testkit.simulated_tier: the ``simulated`` marker names what the simulation covers a
# process test with (make test leaves such tests to make test-long).
# The servers tests start are one process unless a test asks for workers (``--workers N``
# or its own DS_WORKERS): the default, one per CPU, would make what a test runs depend on
# the machine. The default itself: e2e/test_workers.py.
os.environ.setdefault("DS_WORKERS", "1")

pytest_plugins = [
    "testkit.needs",
    "testkit.tiers",
    "testkit.asgi",
    "testkit.seaweedfs",
    "testkit.archive_store",
    "testkit.module_leaks",
    "testkit.simulated_tier",
    "testkit.shared_tls",
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
