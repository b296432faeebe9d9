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

A module marked so is not even imported when the marker is deselected
(``-m "not processes"``): whether it is marked is read from its source
(``marked_module``), so the fast tier does not pay for importing Spark,
kopf's end-to-end tests or the image builders only to deselect them.
``python -m testkit.tiers`` lists the marked modules and counts them: the
figure of how many test files start processes.

This module is a pytest plugin (the root conftest.py loads it); the marker is
registered in pyproject.toml.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

MARKER = "processes"


class ProcessNotMarked(RuntimeError):
    """A test outside the ``processes`` marker tried to start a process."""


def marked(item: pytest.Item) -> bool:
    """True when ``item`` (or its module or class) carries the ``processes`` marker."""
    return item.get_closest_marker(MARKER) is not None


def marked_module(path: Path) -> bool:
    """True when the module at ``path`` sets ``pytestmark`` to the marker, alone or in a
    list, at its top level (read from the source, not imported)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False  # pytest reports it when it imports it
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            assert isinstance(node, ast.Assign)
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            if any(ast.unparse(v) == f"pytest.mark.{MARKER}" for v in values):
                return True
    return False


def test_modules(root: Path) -> list[Path]:
    """Every test module under ``root``'s tests/ and e2e/, sorted."""
    return sorted(p for top in ("tests", "e2e") for p in (root / top).rglob("test_*.py"))


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


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m "not processes..."``, a marked module is left out before it is imported."""
    if f"not {MARKER}" not in (config.getoption("markexpr", "") or ""):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if marked_module(collection_path) else None
    return None


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


def main(argv: list[str]) -> int:
    """List the test modules marked ``processes`` and count them, of all test modules, in
    this checkout or the one named (``python -m testkit.tiers [checkout]``)."""
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    modules = test_modules(root)
    marked = [m for m in modules if marked_module(m)]
    for m in marked:
        print(m.relative_to(root))
    print(f"{len(marked)} of {len(modules)} test modules start processes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
