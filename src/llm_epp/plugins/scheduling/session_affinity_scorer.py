"""session-affinity-scorer

Scheduling intent:
    Keep a client's session on the endpoint that served its earlier requests, as a soft preference: the
    session endpoint scores 1.0 and every other candidate 0.0, so other scorers with enough weight can
    still move the request. A session that names no candidate scores everyone 0 and the others decide.
    `session-affinity-filter` is the hard-pin counterpart; configure one of the two, not both.

Inputs consumed:
    strategy `encoded_endpoint_header` (default, stateless): the request header (default
    `x-session-token`) holding standard base64 of the endpoint's `namespace/name` (Kubernetes
    NamespacedName.String(), so an endpoint without a namespace is `/name`); a token that is not valid
    base64 or UTF-8 is ignored. On the response headers the scorer writes the same header with the token
    of the endpoint that served the request (the ResponseInfo's `served_endpoint` when it names a pool
    endpoint, else the picked endpoint; with `profileName`, that profile's pick) into the request's
    CycleState under RESPONSE_HEADERS_KEY, which the protocol adapter adds to the response.
    strategy `session_id` (stateful): an opaque session id from the first non-empty source (a request
    header, or a request attribute published by an earlier plugin such as `session-id-producer` or
    `agent-identity`). The scorer binds the id to the endpoint the request was routed to (PreRequest)
    and prefers that endpoint while the binding lives; nothing is written back to the client. A bound
    session whose endpoint is not a candidate is re-bound to wherever the request goes.

Configuration:
    strategy (`encoded_endpoint_header` | `session_id`, default `encoded_endpoint_header`).
    profileName (string, default ""): the profile whose pick is remembered (e.g. `prefill` for a second
        instance in a P/D setup); empty means the primary profile.
    encodedEndpointHeaderConfig.header (string, default `x-session-token`).
    sessionIdConfig.sources (list of {header} or {attribute, producer}, default [{header: x-session-id}]),
    sessionIdConfig.evictionTtlSeconds (default 300: a binding unused this long is forgotten),
    sessionIdConfig.evictionSweepSeconds (default 10: how often expired bindings are dropped).
    Bindings are also capped at 100000 per instance (least recently used dropped first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    SchedulingResult,
    ScorerCategory,
    TypedName,
)
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo
from llm_epp.plugins.scheduling._session_affinity import (
    DEFAULT_TOKEN_HEADER,
    SessionAffinity,
    SessionAffinityParams,
    decode_token,
    encode_token,
)

TYPE = "session-affinity-scorer"
HEADER = DEFAULT_TOKEN_HEADER

__all__ = ["HEADER", "RESPONSE_HEADERS_KEY", "TYPE", "Params", "SessionAffinityScorer", "decode_token", "encode_token"]


class Params(SessionAffinityParams):
    pass


class SessionAffinityScorer:
    category = ScorerCategory.AFFINITY

    def __init__(self, name: str = TYPE, handle: Handle | None = None, params: Params | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.affinity = SessionAffinity(f"{TYPE}/{name}", params or Params(), handle)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        target = self.affinity.choose(cycle, request, endpoints)
        wanted = target.key if target is not None else None
        return {e.key: 1.0 if e.key == wanted else 0.0 for e in endpoints}

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.affinity.pre_request(cycle, request, result)

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.affinity.response_received(cycle, response, endpoint)


def factory(name: str, params: Params, handle: Handle) -> SessionAffinityScorer:
    return SessionAffinityScorer(name, handle, params)
