"""What `topology-affinity-filter` and `-scorer` share: the affinity levels and the peer endpoint's topology."""

from __future__ import annotations

import enum

from llm_epp.framework import CycleState, Endpoint
from llm_epp.plugins.datalayer.topology_extractor import Topology
from llm_epp.plugins.disagg.common import PEER_ENDPOINT_KEY


class Level(enum.IntEnum):
    """How close two endpoints are, closest first."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4


LEVEL_NAMES = {"host": Level.HOST, "rack": Level.RACK, "zone": Level.ZONE, "region": Level.REGION}


def compare(peer: Topology, candidate: Topology) -> Level:
    """The closest level both share (a level counts only when both name the same non-empty value)."""
    for level, a, b in (
        (Level.HOST, peer.hostname, candidate.hostname),
        (Level.RACK, peer.rack, candidate.rack),
        (Level.ZONE, peer.zone, candidate.zone),
        (Level.REGION, peer.region, candidate.region),
    ):
        if a and a == b:
            return level
    return Level.NONE


def topology_of(endpoint: Endpoint, key: str) -> Topology | None:
    value = endpoint.attributes.get(key)
    return value if isinstance(value, Topology) else None


def peer_topology(cycle: CycleState, key: str) -> Topology | None:
    """The topology of the endpoint an earlier disaggregation stage picked (`peer-endpoint`), if any."""
    peer = cycle.read(PEER_ENDPOINT_KEY)
    return topology_of(peer, key) if peer is not None else None
