"""A test that replaces a function of the product's modules must put it back.

pytest-xdist runs hundreds of tests in one process: a function replaced and left in place
(``setattr(module, name, stub)`` without monkeypatch) changes every later test in that
worker, and the failure shows far away. It did: a helper that silenced the operator's
Events for the API-load figures left them silenced, and Event tests 30 minutes later
waited for Events that could never come. This plugin fails, at its teardown, the test
after which a function defined in ``stream_operator`` or ``stream_server`` is no longer
the one its module defined.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

PACKAGES = ("stream_operator", "stream_server")


def functions() -> dict[tuple[str, str], object]:
    """Every function a loaded product module defines, by (module, name)."""
    found: dict[tuple[str, str], object] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(PACKAGES):
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and value.__module__ == module_name:
                found[(module_name, name)] = value
    return found


def replaced(before: dict[tuple[str, str], object]) -> list[str]:
    """The functions of ``before`` (a ``functions()``) no longer in their module."""
    return sorted(
        f"{module}.{name}"
        for (module, name), function in before.items()
        if getattr(sys.modules.get(module), name, function) is not function
    )


@pytest.fixture(autouse=True)
def _product_functions_put_back() -> Iterator[None]:
    before = functions()
    yield
    changed = replaced(before)
    if changed:
        pytest.fail(
            f"the test left product functions replaced: {', '.join(changed)} "
            "(use monkeypatch, or restore them in a finally)",
            pytrace=False,
        )
