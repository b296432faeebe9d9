"""Kubernetes quantities by value, never by spelling.

The API server stores a quantity in its canonical form (``1024Mi`` as ``1Gi``, cpu ``2000m``
as ``2``), so whatever the operator compares or sizes (drift, a volume's growth, a claim's
capacity) goes by the number a quantity stands for. The client's parser follows
apimachinery's rules (binary and decimal suffixes, exponents, milli and below) and makes no
API call: it is the one part of the client the pure modules use, through here
(pyproject.toml's purity contract names this import as its only exception).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity


def value(quantity: Any) -> Decimal:
    """The exact number ``quantity`` (a string or a number) stands for; ValueError if it
    is not a quantity."""
    if isinstance(quantity, bool):
        raise ValueError(f"not a quantity: {quantity!r}")
    try:
        return Decimal(parse_quantity(quantity))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ValueError(f"not a quantity: {quantity!r}") from exc


def as_bytes(quantity: Any) -> int:
    """A size in whole bytes (``1.5Gi``: 1610612736); ValueError if not a quantity."""
    return int(value(quantity))


def equal(a: Any, b: Any) -> bool:
    """Whether two spellings stand for the same quantity (a non-quantity equals nothing)."""
    try:
        return value(a) == value(b)
    except ValueError:
        return False
