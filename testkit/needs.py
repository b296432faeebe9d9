"""What a test needs from the machine, and what becomes of it when that is missing.

Run by hand, a test whose program or package is missing is skipped with a
reason that names what is missing and what installs it. ``make test`` first
installs everything (``make deps``) and then sets ``TEST_REQUIRE_ALL=1``:
anything still missing is a broken install, not a reason to pass, so the
same message fails the test instead. The skips that remain under
``make test`` (not about an install: no root, no loop device) are listed by
its ``-rfEs`` summary.

    from testkit import needs

    @needs.commands("openssl", install="Debian's openssl (make system-deps)")
    def test_tls(...): ...

    pytestmark = needs.commands("prometheus", install="Debian's prometheus (make system-deps)")

    ds = needs.module("durable_streams", install="pip install -e '.[dev]'")

    if shutil.which("mkfs.ext4") is None:
        needs.missing("mkfs.ext4 not installed (Debian's e2fsprogs: make system-deps)")

This module is a pytest plugin (the root conftest.py loads it): the
``needs_commands`` marker that ``commands()`` puts on a test becomes a skip
at collection, or under TEST_REQUIRE_ALL a failure at setup.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest

# Not DS_*: the server refuses unknown DS_* settings, and the servers tests start inherit this.
ENV = "TEST_REQUIRE_ALL"
MARKER = "needs_commands"


def required() -> bool:
    """True under ``make test`` (TEST_REQUIRE_ALL=1): what is missing fails, it is not skipped."""
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """Skip the test for ``reason`` (something is not installed), or fail under TEST_REQUIRE_ALL."""
    __tracebackhide__ = True  # report the caller's line
    if required():
        pytest.fail(f"{reason} [{ENV}=1: required here, not skipped]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # also at import (needs.module at top level)


def commands(*names: str, install: str) -> pytest.MarkDecorator:
    """A mark: the test needs these programs on PATH; ``install`` says how to get them."""
    return getattr(pytest.mark, MARKER)(*names, install=install)


def module(name: str, *, install: str) -> ModuleType:
    """Import ``name`` for a test (like pytest.importorskip), or ``missing()`` if it cannot be."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{name} cannot be imported ({exc}); install it: {install}")


def absent(*names: str) -> list[str]:
    """The programs among ``names`` that are not on PATH."""
    return [n for n in names if shutil.which(n) is None]


# ---------------------------------------------------------------- plugin hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*programs, install=how): skip when a program is missing, "
        f"fail instead under {ENV}=1 (make test)",
    )


def _lacking(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run (its marked programs that are missing), or None."""
    for mark in item.iter_markers(MARKER):
        if lacking := absent(*mark.args):
            return f"{', '.join(lacking)} not installed: {mark.kwargs.get('install', '')}"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if required():
        return  # pytest_runtest_setup fails them
    for item in items:
        if reason := _lacking(item):
            item.add_marker(pytest.mark.skip(reason=reason))  # reported at the test's line


def pytest_runtest_setup(item: pytest.Item) -> None:
    if required() and (reason := _lacking(item)):
        missing(reason)
