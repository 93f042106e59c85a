"""topology-affinity-scorer

Scheduling intent:
    In a disaggregated schedule, prefer candidates close to the endpoint the earlier stage picked (the
    prefill pod near its decode pod): same host 1.0, same rack 0.2, same zone 0.05, same region 0.02,
    otherwise 0, as the reference scores them.

Inputs consumed:
    The peer endpoint the disaggregation profile handler publishes (`peer-endpoint`) and the `Topology`
    attribute of it and of each candidate (from `topology-extractor`). Without a peer or its topology, or for
    a candidate without topology, the score is 0.

Configuration:
    topologyProducerName (default "": `topology-extractor`): the name of the topology-extractor to read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

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
from llm_epp.plugins.datalayer.topology_extractor import topology_key
from llm_epp.plugins.scheduling._topology import Level, compare, peer_topology, topology_of

TYPE = "topology-affinity-scorer"
LEVEL_SCORES = {Level.HOST: 1.0, Level.RACK: 0.2, Level.ZONE: 0.05, Level.REGION: 0.02, Level.NONE: 0.0}


class Params(PluginParams):
    topology_producer_name: str = Field(default="", alias="topologyProducerName")


class TopologyAffinityScorer:
    category = ScorerCategory.AFFINITY

    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.key = topology_key(params.topology_producer_name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        peer = peer_topology(cycle, self.key)
        if peer is None:
            return dict.fromkeys((e.key for e in endpoints), 0.0)
        out = {}
        for e in endpoints:
            t = topology_of(e, self.key)
            out[e.key] = LEVEL_SCORES[compare(peer, t)] if t is not None else 0.0
        return out


def factory(name: str, params: Params, handle: Handle) -> TopologyAffinityScorer:
    return TopologyAffinityScorer(name, params)
