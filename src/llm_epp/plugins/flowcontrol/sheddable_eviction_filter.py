"""sheddable-eviction-filter

Scheduling intent:
    When flow control evicts dispatched requests (`flowControl.enableEviction`), only sheddable ones may go:
    those with a negative priority. Requests at priority 0 and above always run to completion. The eviction
    filter flow control uses.

Inputs consumed:
    Each dispatched request's priority (from its InferenceObjective).

Configuration:
    No parameters.
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import EvictionItem

TYPE = "sheddable-eviction-filter"


class Params(PluginParams):
    pass


class SheddableEvictionFilter:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def accept(self, item: EvictionItem) -> bool:
        return item.priority < 0


def factory(name: str, params: Params, handle: Handle) -> SheddableEvictionFilter:
    return SheddableEvictionFilter(name)
