"""Quantities by value, as apimachinery reads them (the spellings the API server stores)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from stream_operator.api import quantities


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("1024Mi", 2**30),
        ("1.5Ti", int(1.5 * 2**40)),
        ("2G", 2 * 10**9),
        ("500m", Decimal("0.5")),  # milli, not mega
        ("1e3", 1000),
        (2, 2),
    ],
)
def test_a_quantity_is_its_value(text, value):
    assert quantities.value(text) == value


@pytest.mark.parametrize("bad", ["", "1Q", "Gi", True, None])
def test_what_is_not_a_quantity_is_refused(bad):
    with pytest.raises(ValueError, match="not a quantity"):
        quantities.value(bad)


def test_spellings_of_one_quantity_are_equal_and_nothing_equals_a_non_quantity():
    assert quantities.equal("1024Mi", "1Gi")
    assert quantities.equal("2", "2000m")
    assert not quantities.equal("1Gi", "1G")
    assert not quantities.equal("x", "x")
    assert quantities.as_bytes("1.5Gi") == 1610612736
