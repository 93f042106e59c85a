"""Plugin identity, the base model for plugin parameters and the handle given to plugin factories."""

from __future__ import annotations

from collections.abc import Sequence
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


class Handle(Protocol):
    """What a plugin factory may use: other plugins by name, the current endpoints, a monotonic clock, and
    the recorder for the plugin's own metrics."""

    def plugin(self, name: str) -> Plugin | None: ...

    def endpoints(self) -> Sequence[Endpoint]: ...

    def now(self) -> float: ...

    @property
    def recorder(self) -> Recorder: ...
