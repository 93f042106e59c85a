"""queue-scorer

Scheduling intent:
    Prefer endpoints with fewer requests waiting in the model server's queue.

Inputs consumed:
    Metrics.waiting_queue_size (vLLM `vllm:num_requests_waiting`, SGLang `sglang:num_queue_reqs`, ...),
    Metrics.running_requests and Endpoint.load.requests (the EPP's own requests in flight there).

    The queue q of an endpoint is its scraped waiting queue plus the requests this EPP has sent it since
    that scrape: q = waiting + max(0, in_flight - in_flight_then), where in_flight_then is the EPP's
    in-flight count there when the scorer first saw that scrape (`Metrics.update_time` changed; requests
    are only sent by scheduling cycles, so no request was sent between the scrape and that look). A
    scrape is up to one interval old (50 ms): without the second term every request of a burst sees the
    same idle queues and the burst lands wherever the other scorers lean. Right after each scrape the
    term is 0 and q is the scraped queue, exactly as in the reference EPP.

Configuration:
    No parameters. Score = (maxQ - q) / (maxQ - minQ) over the candidates; all equal gives 1.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    ScorerCategory,
    TypedName,
)
from llm_epp.framework.normalize import inverse_min_max

TYPE = "queue-scorer"


class Params(PluginParams):
    pass


class QueueScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)
        # per endpoint: (update_time of the scrape, the EPP's in-flight requests there when first seen)
        self._baseline: dict[EndpointKey, tuple[float, int]] = {}

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        baseline = self._baseline
        queues: dict[EndpointKey, float] = {}
        for e in endpoints:
            m = e.metrics
            in_flight = e.load.requests
            seen = baseline.get(e.key)
            if seen is None or seen[0] != m.update_time:  # the first look at this scrape
                seen = baseline[e.key] = (m.update_time, in_flight)
            sent_since = in_flight - seen[1]
            queues[e.key] = float(m.waiting_queue_size + sent_since if sent_since > 0 else m.waiting_queue_size)
        if len(baseline) > 2 * len(endpoints) + 64:  # endpoints that left the pool
            for key in [k for k in baseline if k not in queues]:
                del baseline[key]
        return inverse_min_max(queues)


def factory(name: str, params: Params, handle: Handle) -> QueueScorer:
    return QueueScorer(name)
