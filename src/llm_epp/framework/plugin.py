"""Plugin identity, the base model for plugin parameters and the handle given to plugin factories."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from llm_epp.framework.types import Endpoint

if TYPE_CHECKING:
    from llm_epp.framework.recorder import Recorder


@dataclass(frozen=True, slots=True)
class TypedName:
    """A plugin's registered type (e.g. `queue-scorer`) and its instance name (defaults to the type)."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.name}/{self.type}"


@runtime_checkable
class Plugin(Protocol):
    """Every plugin has a `typed_name`. Extension points are separate protocols a plugin may implement."""

    @property
    def typed_name(self) -> TypedName: ...


class PluginParams(BaseModel):
    """Base of every plugin's `Params`: frozen, unknown keys rejected, camelCase keys as in the reference
    YAML (`maxNumOfEndpoints`), snake_case field names also accepted."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, strict=False)


RandomSource = Callable[[str], random.Random]
"""Gives the random generator of the named owner (a plugin, a scheduling profile, the director)."""


def os_random(name: str) -> random.Random:
    """Serving: every generator is seeded from the operating system."""
    return random.Random()


def seeded_random(seed: int) -> RandomSource:
    """Reproducible runs (the simulator, tests): each owner's generator is seeded from `seed` and the owner's
    name, so adding or reordering plugins does not change the others' streams."""

    def source(name: str) -> random.Random:
        return random.Random(f"{seed}/{name}")

    return source


class Handle(Protocol):
    """What a plugin factory may use: other plugins by name, the current endpoints, a monotonic clock, the
    recorder for the plugin's own metrics, and a random generator."""

    def plugin(self, name: str) -> Plugin | None: ...

    def endpoints(self) -> Sequence[Endpoint]: ...

    def now(self) -> float: ...

    def rng(self, name: str) -> random.Random:
        """A new generator for the plugin called `name` (pass the plugin's own name). Plugins that break ties
        or sample take their randomness from here and from nowhere else: it is seeded from the operating
        system when serving, and from the run's seed and `name` in a reproducible run, such as the
        simulator's. Call it once, in the factory."""
        ...

    @property
    def recorder(self) -> Recorder: ...
