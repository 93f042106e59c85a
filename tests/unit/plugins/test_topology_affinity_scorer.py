"""Tests for topology-affinity-scorer: the reference's scores per shared level with the peer endpoint."""

from __future__ import annotations

from llm_epp.framework import CycleState, ScorerCategory
from llm_epp.plugins.datalayer.topology_extractor import Topology
from llm_epp.plugins.disagg.common import PEER_ENDPOINT_KEY
from llm_epp.plugins.scheduling.topology_affinity_scorer import Params, TopologyAffinityScorer
from tests.unit.builders import endpoint, request

KEY = "Topology/topology-extractor"
PEER = endpoint("decode", attributes={KEY: Topology("h1", "r1", "z1", "eu")})
POOL = [
    endpoint("same-host", attributes={KEY: Topology("h1", "r9", "z9", "eu")}),
    endpoint("same-rack", attributes={KEY: Topology("h2", "r1", "z1", "eu")}),
    endpoint("same-zone", attributes={KEY: Topology("h3", "r2", "z1", "eu")}),
    endpoint("same-region", attributes={KEY: Topology("h4", "", "z2", "eu")}),
    endpoint("far", attributes={KEY: Topology("h5", "r4", "z3", "us")}),
    endpoint("unknown"),
]


def scores(scorer: TopologyAffinityScorer, cycle: CycleState) -> dict[str, float]:
    return {k.name: v for k, v in scorer.score(cycle, request(), POOL).items()}


def test_level_scores() -> None:
    s = TopologyAffinityScorer("s", Params())
    assert s.category is ScorerCategory.AFFINITY
    cycle = CycleState()
    cycle.write(PEER_ENDPOINT_KEY, PEER)
    assert scores(s, cycle) == {
        "same-host": 1.0,
        "same-rack": 0.2,
        "same-zone": 0.05,
        "same-region": 0.02,
        "far": 0.0,
        "unknown": 0.0,
    }


def test_no_peer_scores_zero() -> None:
    s = TopologyAffinityScorer("s", Params())
    assert set(scores(s, CycleState()).values()) == {0.0}
