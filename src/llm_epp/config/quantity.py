"""Kubernetes `resource.Quantity` values, as upstream's `flowControl.maxBytes` / `maxRequests` take them.

Accepted forms (Kubernetes' grammar): an optionally signed decimal number, then at most one of
- a binary suffix `Ki Mi Gi Ti Pi Ei` (powers of 1024),
- a decimal suffix `n u m k M G T P E` (10^-9 ... 10^18; no suffix is 10^0),
- a decimal exponent `e<int>` / `E<int>` (`1e3`, `5E-1`).
A bare YAML number is accepted as it is. The integer value is what Go's `Quantity.Value()` returns: the
quantity rounded up (away from zero) to a whole number, so `1500m` is 2 and `0.1` is 1.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_FORM = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE]?)$")
_HINT = "a Kubernetes quantity such as 1000, 1k, 500Mi, 1Gi or 1e6"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity; the message says which forms are accepted."""


def parse_quantity(value: object) -> int:
    """The integer value of a quantity (rounded up, as Go's `Quantity.Value()`). Raises QuantityError."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity; expected {_HINT}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity; expected {_HINT}")
        return _ceil(Decimal(repr(value)))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity; expected {_HINT}")
    m = _FORM.match(value.strip())
    if m is None:
        raise QuantityError(f"{value!r} is not a quantity; expected {_HINT}")
    number, suffix = m.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise QuantityError(f"{value!r} is not a quantity; expected {_HINT}") from None
    if suffix in _BINARY:
        amount *= Decimal(1024) ** _BINARY[suffix]
    elif len(suffix) > 1:  # an exponent: e3, E-2 (a lone E is the exa suffix)
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            raise QuantityError(f"{value!r}: the exponent is out of range")
        amount = amount.scaleb(exponent)
    else:
        amount = amount.scaleb(_DECIMAL[suffix])
    return _ceil(amount)


def _ceil(amount: Decimal) -> int:
    """Rounds away from zero, as `Quantity.Value()` does."""
    whole = int(amount)
    if amount != whole:
        whole += 1 if amount > 0 else -1
    return whole
