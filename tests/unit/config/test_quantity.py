"""Kubernetes quantities as Go's resource.Quantity.Value() reads them."""

from __future__ import annotations

import pytest

from llm_epp.config.quantity import QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1000", 1000),
        ("1k", 1000),
        ("5M", 5_000_000),
        ("2G", 2_000_000_000),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ki", 1024),
        ("500Mi", 500 * 1024**2),
        ("1Gi", 1024**3),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("2Ti", 2 * 1024**4),
        ("1Pi", 1024**5),
        ("1Ei", 1024**6),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2.5e2", 250),
        ("1e-1", 1),  # rounded up, as Value() does
        ("1500m", 2),
        ("1000m", 1),
        ("1u", 1),
        ("1n", 1),
        ("0.1", 1),
        (".5k", 500),
        ("+7", 7),
        ("-1500m", -2),  # away from zero
        (" 12 ", 12),
    ],
)
def test_quantity_strings(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("number", "value"), [(7, 7), (2.0, 2), (2.1, 3), (0, 0)])
def test_yaml_numbers(number: float, value: int) -> None:
    assert parse_quantity(number) == value


@pytest.mark.parametrize("bad", ["", "k", "1 GB", "1GB", "1kb", "1Ki5", "1e", "e3", "1..0", "0x10", "1e99", "ten"])
def test_malformed_quantities_say_what_is_accepted(bad: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [True, None, [1], float("inf"), float("nan")])
def test_other_values_are_not_quantities(bad: object) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(bad)
