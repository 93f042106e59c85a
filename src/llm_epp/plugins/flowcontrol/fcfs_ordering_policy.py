"""fcfs-ordering-policy

Scheduling intent:
    First come, first served inside a flow: the request that entered the queue first leaves first. The
    default ordering policy of every band.

Inputs consumed:
    Each queued request's enqueue time.

Configuration:
    No parameters.
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import QueueItem

TYPE = "fcfs-ordering-policy"


class Params(PluginParams):
    pass


class FcfsOrderingPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def less(self, a: QueueItem, b: QueueItem) -> bool:
        return a.enqueued_at < b.enqueued_at


def factory(name: str, params: Params, handle: Handle) -> FcfsOrderingPolicy:
    return FcfsOrderingPolicy(name)
