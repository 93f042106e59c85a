"""prefix-hash-scorer

Scheduling intent:
    Prefix affinity for deployments without cache metadata and without the approximate prefix index:
    requests whose prompts start the same go to the same endpoint by consistent hashing with bounded
    load. This plugin is llm-epp's own; neither the reference EPP nor llm-d has it.

    The key is xxh64 of the first `prefixChars` bytes of the request's prompt text (the same text the
    approximate prefix producer hashes: the prompt, or the JSON of chat messages, ...), seeded with the
    target model and cache_salt. The candidates are placed on a hash ring with `virtualNodes` points
    each (xxh64 of "<namespace>/<name>#<i>"); the ring is rebuilt only when the candidate set changes,
    and adding or removing one endpoint moves only the keys of the ring arcs it gains or loses (about
    1/N). From the key's position the ring is walked clockwise to the first endpoint with spare
    capacity ("consistent hashing with bounded loads"): an endpoint is skipped when its in-flight
    requests (`Endpoint.load.requests`, the EPP's own count) are already at or above
    ceil(loadFactor x (total in-flight over the candidates + 1) / N), so after placing this request no
    endpoint exceeds loadFactor times the average. At least one endpoint always qualifies. The chosen
    endpoint scores 1.0, all others 0; a request without prompt text gets no preference (all 0).

Inputs consumed:
    InferenceRequest.body (prompt text), target_model, body.cache_salt; Endpoint.load.requests.

Configuration:
    prefixChars (int >= 1, default 256): how many leading bytes of the prompt text form the key.
    loadFactor (float >= 1, default 1.25): bound on an endpoint's in-flight requests relative to the
        average; a large value turns the bound off.
    virtualNodes (int >= 1, default 100): ring points per endpoint.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from operator import attrgetter

import xxhash
from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, EndpointKey, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.scheduling import ScorerCategory
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import prompt_bytes, seed_hash

TYPE = "prefix-hash-scorer"
_MAX_RINGS = 8
_xxh64 = xxhash.xxh64_intdigest
_key_of = attrgetter("metadata.key")


class Params(PluginParams):
    prefix_chars: int = Field(default=256, ge=1, alias="prefixChars")
    load_factor: float = Field(default=1.25, ge=1.0, alias="loadFactor")
    virtual_nodes: int = Field(default=100, ge=1, alias="virtualNodes")


class _Ring:
    __slots__ = ("owners", "points")

    def __init__(self, keys: frozenset[EndpointKey], virtual_nodes: int) -> None:
        pairs = sorted((_xxh64(f"{k.namespace}/{k.name}#{i}".encode()), k) for k in keys for i in range(virtual_nodes))
        self.points = [p for p, _ in pairs]
        self.owners = [k for _, k in pairs]


class PrefixHashScorer:
    category = ScorerCategory.AFFINITY

    def __init__(
        self, name: str = TYPE, prefix_chars: int = 256, load_factor: float = 1.25, virtual_nodes: int = 100
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.prefix_chars = prefix_chars
        self.load_factor = load_factor
        self.virtual_nodes = virtual_nodes
        self._rings: dict[frozenset[EndpointKey], _Ring] = {}

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def ring(self, keys: frozenset[EndpointKey]) -> _Ring:
        """The ring for a candidate set, built once per distinct set (a few recent sets are kept)."""
        ring = self._rings.get(keys)
        if ring is None:
            if len(self._rings) >= _MAX_RINGS:
                del self._rings[next(iter(self._rings))]
            ring = self._rings[keys] = _Ring(keys, self.virtual_nodes)
        return ring

    def request_key(self, request: InferenceRequest) -> int | None:
        """The ring position of a request, or None when it has no prompt text."""
        data = prompt_bytes(request.body, self.prefix_chars)
        if not data:
            return None
        return _xxh64(data, seed=seed_hash(request.target_model, request.body.cache_salt))

    def choose(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> EndpointKey | None:
        if not endpoints:
            return None
        position = self.request_key(request)
        if position is None:
            return None
        if len(endpoints) == 1:
            return endpoints[0].key
        keys = list(map(_key_of, endpoints))
        ring = self.ring(frozenset(keys))
        load = {k: e.load.requests for k, e in zip(keys, endpoints, strict=True)}
        capacity = math.ceil(self.load_factor * (sum(load.values()) + 1) / len(load))
        points, owners = ring.points, ring.owners
        n = len(points)
        start = bisect_left(points, position)
        for step in range(n):
            owner = owners[(start + step) % n]
            if load[owner] < capacity:
                return owner
        return owners[start % n]  # unreachable: the least-loaded endpoint is always below capacity

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        chosen = self.choose(request, endpoints)
        scores = dict.fromkeys(map(_key_of, endpoints), 0.0)
        if chosen is not None:
            scores[chosen] = 1.0
        return scores


def factory(name: str, params: Params, handle: Handle) -> PrefixHashScorer:
    return PrefixHashScorer(name, params.prefix_chars, params.load_factor, params.virtual_nodes)
