"""p2p-source-producer

Scheduling intent:
    Let the endpoint that computes a request pull the prompt's cached KV blocks from a peer over the P2P
    connector instead of recomputing them: name, in the request header `x-kv-cache-source-host-port`, a
    peer that caches within one block of the most prompt tokens. Among such peers one is drawn with weight
    1 / (1 + waiting queue), using a hash of the request id as the draw, so pulls of a widely cached prefix
    spread over its replicas. The header is set only when the peer caches at least `minCachedTokenDelta`
    tokens more than the computing endpoint (the `prefill` profile's pick when that profile ran, else the
    primary pick), and never names the computing endpoint itself.

Inputs consumed:
    The request's `PrefixMatch` (from the default prefix producer, or from the one
    `prefixMatchInfoProducerName` names): cached tokens of an endpoint =
    matched blocks x block size in tokens. Endpoint.metrics.waiting_queue_size. The SchedulingResult.
    The header only has an effect where the routing sidecar and vLLM's OffloadingConnector with a `p2p`
    tier consume it.

Configuration:
    minCachedTokenDelta (int >= 1, default 1): how many more cached tokens the peer must hold.
    prefillProfileName (string, default `prefill`): the profile whose pick computes the prompt.
    prefixMatchInfoProducerName (string, default ""): the `name` of the declared prefix producer instance
        whose match to read; empty (or `approx-prefix-cache-producer`) reads the default producer's. A name
        no declared prefix producer has is rejected when the configuration loads.

Outputs produced:
    REQUEST_HEADERS_KEY[`x-kv-cache-source-host-port`] = `ip:port` of the peer, in PreRequest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field, field_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    StateKey,
    TypedName,
)
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PrefixMatch,
    check_prefix_producer_name,
    prefix_match_key,
)

TYPE = "p2p-source-producer"
HEADER = "x-kv-cache-source-host-port"
DEFAULT_PREFILL_PROFILE = "prefill"


class Params(PluginParams):
    min_cached_token_delta: int = Field(default=1, ge=1, alias="minCachedTokenDelta")
    prefill_profile_name: str = Field(default="", alias="prefillProfileName")
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")

    _producer_name = field_validator("prefix_match_info_producer_name")(check_prefix_producer_name)


@dataclass(frozen=True, slots=True)
class Peer:
    hostport: str
    cached_tokens: int


def spread_fraction(request_id: str) -> float:
    """FNV-1a (32 bit) of the request id, as a fraction in [0, 1): the request's sampling coordinate."""
    h = 0x811C9DC5
    for byte in request_id.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h / 2**32


def _cached_tokens(match: PrefixMatch, endpoint: Endpoint) -> int:
    return match.matches.get(endpoint.key, 0) * match.block_size_tokens


class P2pSourceProducer:
    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        params = params or Params()
        self._typed_name = TypedName(TYPE, name)
        self.match_key = prefix_match_key(params.prefix_match_info_producer_name)
        self.consumes = frozenset({self.match_key.name})
        self.min_delta = params.min_cached_token_delta
        self.prefill_profile = params.prefill_profile_name or DEFAULT_PREFILL_PROFILE
        self._candidates: StateKey[tuple[Endpoint, ...]] = StateKey(f"{TYPE}/{name}/candidates")

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def best_peer(self, match: PrefixMatch | None, request_id: str, endpoints: Sequence[Endpoint]) -> Peer | None:
        if match is None or match.block_size_tokens <= 0:
            return None
        cached = [(e, c) for e in endpoints if (c := _cached_tokens(match, e)) > 0]
        if not cached:
            return None
        most = max(c for _, c in cached)
        block = match.block_size_tokens
        band = [(e, c, 1.0 / (1.0 + e.metrics.waiting_queue_size)) for e, c in cached if c + block >= most]
        target = spread_fraction(request_id) * sum(w for _, _, w in band)
        chosen = band[-1]
        for entry in band:
            if target < entry[2]:
                chosen = entry
                break
            target -= entry[2]
        return Peer(chosen[0].hostport, chosen[1])

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        # the candidates are remembered here; the peer is chosen in PreRequest, when the prefix match is
        # there whatever order the PrepareData plugins ran in
        cycle.write(self._candidates, tuple(endpoints))

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        match = cycle.read(self.match_key)
        candidates = cycle.read(self._candidates)
        best = self.best_peer(match, request.request_id, candidates or ())
        if best is None or match is None:
            return
        computing = result.profile_results.get(self.prefill_profile)
        if computing is None or not computing.target_endpoints:
            computing = result.profile_results.get(result.primary_profile_name)
        if computing is None or not computing.target_endpoints:
            return
        endpoint = computing.target_endpoints[0]
        if endpoint.hostport == best.hostport:
            return
        own = _cached_tokens(match, endpoint)
        if best.cached_tokens - own < self.min_delta:
            return
        headers = cycle.read(REQUEST_HEADERS_KEY)
        if headers is None:
            headers = {}
            cycle.write(REQUEST_HEADERS_KEY, headers)
        headers[HEADER] = best.hostport


def factory(name: str, params: Params, handle: Handle) -> P2pSourceProducer:
    return P2pSourceProducer(name, params)
