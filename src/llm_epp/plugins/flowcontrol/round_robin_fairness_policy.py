"""round-robin-fairness-policy

Scheduling intent:
    Take turns between the flows (fairness ids) of a band: after serving one flow, the next flow with
    waiting requests in flow-key order is served, so a tenant with a deep backlog cannot starve the
    others.

Inputs consumed:
    The band's flows with queued requests; a per-band cursor (the flow served last).

Configuration:
    No parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import BandView, FlowKey, FlowQueueView

TYPE = "round-robin-fairness-policy"


class Params(PluginParams):
    pass


@dataclass
class _Cursor:
    last: FlowKey | None = None


class RoundRobinFairnessPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def new_state(self) -> object:
        return _Cursor()

    def pick_flow(self, band: BandView) -> FlowQueueView | None:
        cursor = band.policy_state
        assert isinstance(cursor, _Cursor)
        keys = sorted(band.flow_keys())
        if not keys:
            cursor.last = None
            return None
        start = 0
        if cursor.last is not None:
            # the first flow after the last one served, in key order (it may have left the band since)
            start = next((i for i, k in enumerate(keys) if k > cursor.last), 0)
        for i in range(len(keys)):
            key = keys[(start + i) % len(keys)]
            queue = band.queue(key.id)
            if queue is not None and len(queue):
                cursor.last = key
                return queue
        cursor.last = None
        return None


def factory(name: str, params: Params, handle: Handle) -> RoundRobinFairnessPolicy:
    return RoundRobinFairnessPolicy(name)
