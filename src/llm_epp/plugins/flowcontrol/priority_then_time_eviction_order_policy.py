"""priority-then-time-eviction-order-policy

Scheduling intent:
    When flow control evicts dispatched requests (`flowControl.enableEviction`), the lowest priority goes
    first; among equal priorities the most recently dispatched goes first, since it has had the least time
    to build up KV cache and output on its model server. The eviction order flow control uses.

Inputs consumed:
    Each evictable request's priority and dispatch time.

Configuration:
    No parameters.
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import EvictionItem

TYPE = "priority-then-time-eviction-order-policy"


class Params(PluginParams):
    pass


class PriorityThenTimeEvictionOrderPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def evict_before(self, a: EvictionItem, b: EvictionItem) -> bool:
        if a.priority != b.priority:
            return a.priority < b.priority
        return a.dispatched_at > b.dispatched_at


def factory(name: str, params: Params, handle: Handle) -> PriorityThenTimeEvictionOrderPolicy:
    return PriorityThenTimeEvictionOrderPolicy(name)
