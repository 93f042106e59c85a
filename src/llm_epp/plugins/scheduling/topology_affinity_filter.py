"""topology-affinity-filter

Scheduling intent:
    In a disaggregated schedule, keep only the candidates close to the endpoint the earlier stage picked
    (the prefill pod near its decode pod): on the same host by default, so the KV cache moves over NVLink
    rather than the network.

Inputs consumed:
    The peer endpoint the disaggregation profile handler publishes (`peer-endpoint`) and the `Topology`
    attribute of it and of each candidate (from `topology-extractor`). Without a peer or its topology every
    candidate passes; a candidate without topology is dropped. When no candidate is close enough, all pass
    (the filter never empties the set).

Configuration:
    minAffinity (`host` | `rack` | `zone` | `region`, default `host`): the farthest level that still passes.
    topologyProducerName (default "": `topology-extractor`): the name of the topology-extractor to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.datalayer.topology_extractor import topology_key
from llm_epp.plugins.scheduling._topology import LEVEL_NAMES, compare, peer_topology, topology_of

TYPE = "topology-affinity-filter"


class Params(PluginParams):
    min_affinity: Literal["host", "rack", "zone", "region"] = Field(default="host", alias="minAffinity")
    topology_producer_name: str = Field(default="", alias="topologyProducerName")


class TopologyAffinityFilter:
    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.min_affinity = LEVEL_NAMES[params.min_affinity]
        self.key = topology_key(params.topology_producer_name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        peer = peer_topology(cycle, self.key)
        if peer is None:
            return endpoints
        kept = [
            e
            for e in endpoints
            if (t := topology_of(e, self.key)) is not None and compare(peer, t) <= self.min_affinity
        ]
        return kept or endpoints


def factory(name: str, params: Params, handle: Handle) -> TopologyAffinityFilter:
    return TopologyAffinityFilter(name, params)
