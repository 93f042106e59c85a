"""edf-ordering-policy

Scheduling intent:
    Earliest deadline first inside a flow: the request whose queueing budget runs out soonest leaves
    first, so short time-to-live requests are not starved behind patient ones. Requests without a time
    to live come last; ties go to the earlier arrival.

Inputs consumed:
    Each queued request's enqueue time and time to live (deadline = enqueue time + TTL).

Configuration:
    No parameters.
"""

from __future__ import annotations

import math

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import QueueItem

TYPE = "edf-ordering-policy"


class Params(PluginParams):
    pass


def deadline(item: QueueItem) -> float:
    ttl = item.ttl
    return item.enqueued_at + ttl if ttl is not None and ttl > 0 else math.inf


class EdfOrderingPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def less(self, a: QueueItem, b: QueueItem) -> bool:
        da, db = deadline(a), deadline(b)
        if da != db:
            return da < db
        return a.enqueued_at < b.enqueued_at


def factory(name: str, params: Params, handle: Handle) -> EdfOrderingPolicy:
    return EdfOrderingPolicy(name)
