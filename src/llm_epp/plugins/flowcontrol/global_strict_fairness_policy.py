"""global-strict-fairness-policy

Scheduling intent:
    No fairness between flows: the band behaves as one queue. The flow whose head request comes first
    under the ordering policy is served next (with FCFS: the oldest request of the whole band). The
    default fairness policy of every band.

Inputs consumed:
    The head request of every non-empty flow of the band, compared with the flows' ordering policy.

Configuration:
    No parameters.
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import BandView, FlowQueueView, QueueItem

TYPE = "global-strict-fairness-policy"


class Params(PluginParams):
    pass


class GlobalStrictFairnessPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def new_state(self) -> object:
        return None

    def pick_flow(self, band: BandView) -> FlowQueueView | None:
        best: FlowQueueView | None = None
        best_item: QueueItem | None = None
        for queue in band.queues():
            item = queue.peek()
            if item is None:
                continue
            if best is None or best_item is None or queue.ordering.less(item, best_item):
                best, best_item = queue, item
        return best


def factory(name: str, params: Params, handle: Handle) -> GlobalStrictFairnessPolicy:
    return GlobalStrictFairnessPolicy(name)
