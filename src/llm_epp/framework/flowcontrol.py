"""Saturation detection, used by admission (shedding sheddable requests) and by flow control (dispatch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.types import Endpoint


@runtime_checkable
class SaturationDetector(Protocol):
    """How saturated the given endpoints are: 0 = idle, >= 1.0 = saturated (sheddable requests are refused).
    Stale or missing metrics count as saturated. Synchronous and cheap: called once per request."""

    @property
    def typed_name(self) -> TypedName: ...

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...
