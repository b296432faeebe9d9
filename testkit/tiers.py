"""The fast tier and the ``processes`` marker: a test that starts a process must say so.

A test module that starts real processes or containers (a server it kills,
a replica set, podman, Prometheus, the official clients, a CLI run) carries

    pytestmark = pytest.mark.processes

and everything else is the fast tier (``make test-fast``, ``-m "not
processes"``), which tests the server in-process (``testkit.asgi``). What
keeps the tier fast is that it cannot grow slow by accident: while an
unmarked test sets up, runs or tears down, starting a process raises
``ProcessNotMarked``, naming the module to mark. The check sits at
``subprocess.Popen``'s one spawning method, so ``subprocess.run``, the
server processes of ``testkit.servers`` and asyncio's subprocesses are all
caught. The server's own JSON worker (a multiprocessing forkserver) is part
of the app under test and is not a test's process: it is not caught.

This module is a pytest plugin (the root conftest.py loads it); the marker is
registered in pyproject.toml.
"""

from __future__ import annotations

import subprocess
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

MARKER = "processes"


class ProcessNotMarked(RuntimeError):
    """A test outside the ``processes`` marker tried to start a process."""


def marked(item: pytest.Item) -> bool:
    """True when ``item`` (or its module or class) carries the ``processes`` marker."""
    return item.get_closest_marker(MARKER) is not None


@contextmanager
def processes_refused(item: pytest.Item) -> Iterator[None]:
    """While inside: ``subprocess.Popen`` refuses to start anything, naming ``item``'s module."""
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        program = args if isinstance(args, (str, bytes)) else list(args)[:3]
        raise ProcessNotMarked(
            f"{item.nodeid} started a process ({program!r}) but its module is not marked: "
            f"add `pytestmark = pytest.mark.{MARKER}` to {item.path.name} (it then leaves "
            "the fast tier), or test it in-process (testkit.asgi)"
        )

    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        subprocess.Popen._execute_child = original  # type: ignore[attr-defined]


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    if marked(item):
        yield
        return
    with processes_refused(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    yield from _guarded(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    yield from _guarded(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield from _guarded(item)
