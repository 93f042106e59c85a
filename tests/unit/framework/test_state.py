"""Tests for llm_epp.framework.state: the per-cycle typed dictionary."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, StateKey

COUNT: StateKey[int] = StateKey("count")
LABEL: StateKey[str] = StateKey("label")


def test_read_returns_what_was_written() -> None:
    cycle = CycleState()
    cycle.write(COUNT, 3)
    cycle.write(LABEL, "x")
    assert cycle.read(COUNT) == 3
    assert cycle.read(LABEL) == "x"


def test_read_of_an_absent_key_is_none() -> None:
    cycle = CycleState()
    assert cycle.read(COUNT) is None
    assert COUNT not in cycle


@pytest.mark.parametrize("value", [0, None, ""], ids=["zero", "none", "empty-string"])
def test_falsy_values_are_present(value: object) -> None:
    key: StateKey[object] = StateKey("falsy")
    cycle = CycleState()
    cycle.write(key, value)
    assert key in cycle
    assert cycle.read(key) == value


def test_write_overwrites() -> None:
    cycle = CycleState()
    cycle.write(COUNT, 1)
    cycle.write(COUNT, 2)
    assert cycle.read(COUNT) == 2


def test_keys_are_compared_by_identity_not_by_name() -> None:
    # Plugins define their keys once at module level; two keys that happen to share a name do not collide.
    other: StateKey[int] = StateKey("count")
    cycle = CycleState()
    cycle.write(COUNT, 1)
    assert other not in cycle
    assert cycle.read(other) is None


def test_cycles_do_not_share_data() -> None:
    first, second = CycleState(), CycleState()
    first.write(COUNT, 1)
    assert COUNT not in second


def test_key_repr_names_the_key() -> None:
    assert repr(COUNT) == "StateKey('count')"
