"""session-affinity-filter

Scheduling intent:
    Pin a session to the endpoint that served its earlier requests, as a hard constraint: when the
    session endpoint is a candidate it is the only one kept; with no session, an undecodable token, or a
    session endpoint that is no longer a candidate, every candidate passes so later filters and scorers
    decide. Never returns an empty list. `session-affinity-scorer` is the soft counterpart; configure
    one of the two, not both (under `session_id` they keep separate bindings and can disagree).

Inputs consumed:
    The same as `session-affinity-scorer`: strategy `encoded_endpoint_header` reads the base64
    `namespace/name` token from a request header and writes the serving endpoint's token on the response
    headers (RESPONSE_HEADERS_KEY); strategy `session_id` reads a session id from request headers or
    request attributes and binds it, server-side, to the endpoint the request was routed to.

Configuration:
    strategy (`encoded_endpoint_header` | `session_id`, default `encoded_endpoint_header`),
    profileName (default "": the primary profile), encodedEndpointHeaderConfig.header (default
    `x-session-token`), sessionIdConfig.sources (default [{header: x-session-id}]),
    sessionIdConfig.evictionTtlSeconds (default 300), sessionIdConfig.evictionSweepSeconds (default 10).
    See `session-affinity-scorer` for each parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, SchedulingResult, TypedName
from llm_epp.framework.requestcontrol import ResponseInfo
from llm_epp.plugins.scheduling._session_affinity import SessionAffinity, SessionAffinityParams

TYPE = "session-affinity-filter"


class Params(SessionAffinityParams):
    pass


class SessionAffinityFilter:
    def __init__(self, name: str = TYPE, handle: Handle | None = None, params: Params | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.affinity = SessionAffinity(f"{TYPE}/{name}", params or Params(), handle)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        target = self.affinity.choose(cycle, request, endpoints)
        return endpoints if target is None else [target]

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.affinity.pre_request(cycle, request, result)

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.affinity.response_received(cycle, response, endpoint)


def factory(name: str, params: Params, handle: Handle) -> SessionAffinityFilter:
    return SessionAffinityFilter(name, handle, params)
