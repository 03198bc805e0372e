"""Exact Kubernetes quantities, as the fit checks need them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.quantity import (
    MAX_EXPONENT,
    MAX_QUANTITY_LENGTH,
    format_units,
    parse_quantity,
    quantity_units,
    to_units,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", Fraction(1, 10)),
        ("1Gi", 1024**3),
        ("512Mi", 512 * 1024**2),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1.5", Fraction(3, 2)),
        ("2k", 2000),
        ("1E", 10**18),
        ("1Ki", 1024),
        ("0.5Gi", 512 * 1024**2),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("-1", -1),
        ("+2", 2),
        ("250u", Fraction(1, 4000)),
        ("3n", Fraction(3, 10**9)),
        ("1.25e-2", Fraction(1, 80)),
        ("0", 0),
        (7, 7),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity_is_exact(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "m", "1.2.3", "1 Gi", "1gi", "1K", "e3", "1e", "1e999", True])
def test_parse_quantity_rejects_malformed(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "hostile",
    [
        "1e1000000000",
        "1e-1000000000",
        f"1e{MAX_EXPONENT + 1}",
        "1" * (MAX_QUANTITY_LENGTH + 1),
        "9" * 10_000_000,  # would be a quadratic-time integer conversion
        "0." + "0" * 1_000_000 + "1",
        "1e" + "9" * 1_000_000,
        10**MAX_QUANTITY_LENGTH,
        -(10**5000),
    ],
    ids=lambda v: f"{type(v).__name__}-{len(v) if isinstance(v, str) else v.bit_length()}",
)
def test_parse_quantity_refuses_absurd_sizes(hostile: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(hostile)  # type: ignore[arg-type]


def test_parse_quantity_bounds_still_admit_every_real_quantity() -> None:
    assert parse_quantity(f"1e{MAX_EXPONENT}") == 10**MAX_EXPONENT
    assert parse_quantity(f"1e-{MAX_EXPONENT}") == Fraction(1, 10**MAX_EXPONENT)
    assert parse_quantity("9" * MAX_QUANTITY_LENGTH) == 10**MAX_QUANTITY_LENGTH - 1
    assert parse_quantity(f"  {'1' * MAX_QUANTITY_LENGTH}  ") == int("1" * MAX_QUANTITY_LENGTH)
    assert parse_quantity("8Ei") == 8 * 2**60 and parse_quantity("9223372036854775807") == 2**63 - 1
    assert parse_quantity(10**MAX_QUANTITY_LENGTH - 1) == 10**MAX_QUANTITY_LENGTH - 1


def test_to_units_rounds_up_like_kubernetes() -> None:
    assert to_units(parse_quantity("0.0001"), "cpu") == 1  # MilliValue() rounds up
    assert to_units(parse_quantity("1.5"), "cpu") == 1500
    assert to_units(parse_quantity("0.5"), "memory") == 1
    assert to_units(parse_quantity("1Gi"), "memory") == 1024**3


@pytest.mark.parametrize(
    ("units", "resource", "text"),
    [
        (500, "cpu", "500m"),
        (2000, "cpu", "2"),
        (0, "cpu", "0"),
        (512 * 1024**2, "memory", "512Mi"),
        (1536 * 1024**2, "memory", "1536Mi"),
        (1024**3, "ephemeral-storage", "1Gi"),
        (1000, "memory", "1000"),
        (0, "memory", "0"),
        (110, "pods", "110"),
        (2 * 1024**2, "hugepages-2Mi", "2Mi"),
    ],
)
def test_format_units(units: int, resource: str, text: str) -> None:
    assert format_units(units, resource) == text


@given(st.integers(0, 10**15), st.sampled_from(["cpu", "memory", "pods"]))
def test_formatted_units_parse_back(units: int, resource: str) -> None:
    assert to_units(parse_quantity(format_units(units, resource)), resource) == units


@given(
    st.one_of(
        st.integers(min_value=-(10**6), max_value=10**6),
        st.from_regex(r"[0-9]{1,6}(\.[0-9]{1,3})?(m|Ki|Mi|Gi|k|M|G)?", fullmatch=True),
    ),
    st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]),
)
def test_quantity_units_is_to_units_of_parse_quantity(value: int | str, resource: str) -> None:
    """The remembered form a node's allocatable is read through gives the same units."""
    assert quantity_units(value, resource) == to_units(parse_quantity(value), resource)


def test_quantity_units_refuses_what_parse_quantity_refuses() -> None:
    for bad in ("lots", "1" * (MAX_QUANTITY_LENGTH + 1), True):
        with pytest.raises(ValueError):
            quantity_units(bad, "cpu")
