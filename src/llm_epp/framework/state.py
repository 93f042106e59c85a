"""Per-scheduling-cycle state shared between plugins, read and written through typed keys."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class StateKey(Generic[T]):
    """A typed key: `cycle.read(KEY)` returns a `T` without casts at the call site."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class CycleState:
    """A small typed dictionary that lives for one scheduling cycle (one request)."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[StateKey[Any], Any] = {}

    def write(self, key: StateKey[T], value: T) -> None:
        self._data[key] = value

    def read(self, key: StateKey[T]) -> T | None:
        return cast("T | None", self._data.get(key))

    def __contains__(self, key: StateKey[Any]) -> bool:
        return key in self._data
