"""Exact Kubernetes resource quantities (``100m``, ``1Gi``, ``1e3``, ``1.5``, ``2k``).

Parsed to ``fractions.Fraction`` so nothing is lost to floats: the scheduler's fit checks
must agree with kube-scheduler to the milli-CPU and the byte.

Inputs come from objects anyone may write (Node status, pod specs), so parsing is bounded:
a string longer than ``MAX_QUANTITY_LENGTH`` or an exponent beyond ``MAX_EXPONENT`` is
malformed, and no input builds an integer of more than a few hundred bits.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Final

#: Longer quantity strings are malformed. Kubernetes' canonical form of any quantity it
#: stores is far shorter (an int64 mantissa and a suffix); the bound keeps a hostile
#: string of a million digits from costing a quadratic-time integer conversion.
MAX_QUANTITY_LENGTH: Final = 64
#: ``1eN`` with ``|N|`` above this is malformed (``1e1000000000`` would be a gigabyte int).
MAX_EXPONENT: Final = 64
#: How many distinct quantity strings are remembered parsed (least recently used go first):
#: a cluster uses a few dozen; strings of at most MAX_QUANTITY_LENGTH keep it small.
QUANTITY_CACHE_SIZE: Final = 4096

_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?"
)


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity string; ints pass through. Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        if abs(text) >= 10**MAX_QUANTITY_LENGTH:  # as absurd as a string that long
            raise ValueError(f"quantity out of range: an integer of {text.bit_length()} bits")
        return Fraction(text)
    if isinstance(text, float):  # JSON numbers in hand-written objects
        return Fraction(str(text))
    if not isinstance(text, str):
        raise ValueError(f"not a quantity: {text!r}")
    text = text.strip()
    if len(text) > MAX_QUANTITY_LENGTH:
        raise ValueError(f"quantity longer than {MAX_QUANTITY_LENGTH} characters: {text[:20]!r}...")
    return _parse_text(text)


@lru_cache(maxsize=QUANTITY_CACHE_SIZE)
def _parse_text(text: str) -> Fraction:
    """``parse_quantity`` of a short stripped string, remembered: the fit check reads the
    same few strings (a node's allocatable, the pods' requests) for every pod it places."""
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    value = Fraction(m["num"])
    if m["exp"]:
        exp = int(m["exp"][1:])
        if abs(exp) > MAX_EXPONENT:
            raise ValueError(f"quantity exponent out of range: {text!r}")
        value *= Fraction(10) ** exp
    elif m["suffix"] in _BINARY:
        value *= 1024 ** _BINARY[m["suffix"]]
    else:
        value *= Fraction(10) ** _DECIMAL[m["suffix"] or ""]
    return -value if m["sign"] == "-" else value


def to_units(value: Fraction, resource: str) -> int:
    """The integer kube-scheduler compares: milli-units for cpu, whole units otherwise.

    Rounded up, as ``Quantity.MilliValue()``/``Value()`` do.
    """
    return math.ceil(value * 1000) if resource == "cpu" else math.ceil(value)


def quantity_units(value: str | int | float, resource: str) -> int:
    """``to_units(parse_quantity(value), resource)``, a string's remembered: a node's
    allocatable is read on every fit check. Raises ValueError."""
    if isinstance(value, str) and len(value) <= MAX_QUANTITY_LENGTH:
        return _text_units(value, resource)
    return to_units(parse_quantity(value), resource)


@lru_cache(maxsize=QUANTITY_CACHE_SIZE)
def _text_units(text: str, resource: str) -> int:
    return to_units(parse_quantity(text), resource)


def format_units(units: int, resource: str) -> str:
    """Readable form of ``to_units`` output: ``500m``/``2`` for cpu, ``512Mi`` for bytes."""
    if resource == "cpu":
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    is_bytes = resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-")
    if is_bytes and units:
        for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if units % 1024**power == 0:
                return f"{units // 1024**power}{suffix}"
    return str(units)
