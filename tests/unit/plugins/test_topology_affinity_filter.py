"""Tests for topology-affinity-filter: candidates close to the peer endpoint of a disaggregated schedule."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState
from llm_epp.plugins.datalayer.topology_extractor import Topology
from llm_epp.plugins.disagg.common import PEER_ENDPOINT_KEY
from llm_epp.plugins.scheduling.topology_affinity_filter import Params, TopologyAffinityFilter
from tests.unit.builders import endpoint, names, request

KEY = "Topology/topology-extractor"
PEER = endpoint("decode", attributes={KEY: Topology("h1", "r1", "z1", "eu")})
POOL = [
    endpoint("same-host", attributes={KEY: Topology("h1", "r1", "z1", "eu")}),
    endpoint("same-rack", attributes={KEY: Topology("h2", "r1", "z1", "eu")}),
    endpoint("same-zone", attributes={KEY: Topology("h3", "r2", "z1", "eu")}),
    endpoint("same-region", attributes={KEY: Topology("h4", "r3", "z2", "eu")}),
    endpoint("far", attributes={KEY: Topology("h5", "r4", "z3", "us")}),
    endpoint("unknown"),
]


def cycle_with(peer: object) -> CycleState:
    cycle = CycleState()
    if peer is not None:
        cycle.write(PEER_ENDPOINT_KEY, peer)  # type: ignore[arg-type]
    return cycle


@pytest.mark.parametrize(
    ("level", "kept"),
    [
        ("host", ["same-host"]),
        ("rack", ["same-host", "same-rack"]),
        ("zone", ["same-host", "same-rack", "same-zone"]),
        ("region", ["same-host", "same-rack", "same-zone", "same-region"]),
    ],
)
def test_min_affinity(level: str, kept: list[str]) -> None:
    f = TopologyAffinityFilter("f", Params.model_validate({"minAffinity": level}))
    assert names(f.filter(cycle_with(PEER), request(), POOL)) == kept


def test_without_a_peer_or_a_match_everything_passes() -> None:
    f = TopologyAffinityFilter("f", Params())
    assert names(f.filter(cycle_with(None), request(), POOL)) == names(POOL)
    assert names(f.filter(cycle_with(endpoint("decode")), request(), POOL)) == names(POOL)  # peer without topology
    lonely = endpoint("decode", attributes={KEY: Topology("h9")})
    assert names(f.filter(cycle_with(lonely), request(), POOL)) == names(POOL)  # never empties the set


def test_another_producer_name_reads_its_attribute() -> None:
    f = TopologyAffinityFilter("f", Params.model_validate({"topologyProducerName": "topo"}))
    assert f.key == "Topology/topo"
    assert names(f.filter(cycle_with(PEER), request(), POOL)) == names(POOL)  # the peer has no Topology/topo


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValidationError, match="host"):
        Params.model_validate({"minAffinity": "datacenter"})
