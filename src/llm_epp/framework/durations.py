"""Go `time.ParseDuration` strings ("200ms", "2s", "1m30s"), as the reference EPP's flags and plugin
parameters use them."""

from __future__ import annotations

import re

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign
    "\u03bcs": 1e-6,  # Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_COMPONENT = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go `time.ParseDuration` string: "200ms", "1.5s", "2m", "1h30m", "-1s", "0"."""
    s = text.strip()
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total, pos = 0.0, 0
    while pos < len(s):
        m = _COMPONENT.match(s, pos)
        if m is None:
            rest = s[pos:]
            if re.fullmatch(r"\d+\.?\d*|\.\d+", rest):
                raise ValueError(f"invalid duration {text!r}: missing unit (use e.g. 200ms, 2s, 1m)")
            raise ValueError(f"invalid duration {text!r}: use a number with a unit (ns, us, ms, s, m, h)")
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    return sign * total
