"""The `interval` parameter of polled data sources: a Go duration, empty for every base tick."""

from __future__ import annotations

from llm_epp.framework.durations import parse_go_duration


def check_interval(value: str) -> str:
    """`value` if it is empty or a non-negative Go duration; raises ValueError otherwise."""
    if value and parse_go_duration(value) < 0:
        raise ValueError(f"interval must not be negative, got {value!r}")
    return value


def interval_seconds(value: str) -> float:
    """A source's `interval` parameter in seconds (0: every base tick)."""
    return parse_go_duration(value) if value else 0.0
