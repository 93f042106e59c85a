"""session-affinity-scorer

Scheduling intent:
    Keep a client's session on the endpoint that served its previous request (llm-d semantics): the
    response carries a session token naming the endpoint that served it, the client echoes it back on
    its next request, and this scorer gives that endpoint 1.0 and every other candidate 0.0. A token
    that names no candidate (the endpoint left the pool, a filter removed it) scores everyone 0, so
    the other scorers decide.

Inputs consumed:
    Request header `x-session-token`: standard base64 (with padding) of the endpoint's `namespace/name`
    (Kubernetes NamespacedName.String(), so an endpoint without a namespace is `/name`). A token that is
    not valid base64 or UTF-8 is ignored.
    On the response, the endpoint that served the request (the ResponseInfo's `served_endpoint` when
    it names a pool endpoint, else the picked endpoint).

Configuration:
    No parameters.

Response token:
    llm-d sets `x-session-token` on the last response-body chunk, which Envoy may already have sent the
    headers for (so the token can be lost); later upstream moved it to the response headers. This plugin
    does the latter: in ResponseReceived (response headers) it writes the token into the request's
    CycleState under RESPONSE_HEADERS_KEY, a `dict[str, str]` of headers to add to the response. The
    ext_proc adapter must merge that dict into the response-headers mutation it answers with (the
    director calls ResponseReceived before that answer is built).
"""

from __future__ import annotations

import base64
import binascii
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
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo

TYPE = "session-affinity-scorer"
HEADER = "x-session-token"


class Params(PluginParams):
    pass


def encode_token(key: EndpointKey) -> str:
    """The session token naming `key`: base64 of `namespace/name`, as llm-d writes it."""
    return base64.b64encode(f"{key.namespace}/{key.name}".encode()).decode("ascii")


def decode_token(token: str) -> EndpointKey | None:
    """The endpoint a session token names, or None when it is not a valid token."""
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    namespace, slash, name = text.partition("/")
    if not slash or not name:
        return None
    return EndpointKey(namespace, name)


class SessionAffinityScorer:
    category = ScorerCategory.AFFINITY

    def __init__(self, name: str = TYPE, handle: Handle | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self._handle = handle

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        token = request.headers.get(HEADER)
        wanted = decode_token(token) if token else None
        return {e.key: 1.0 if e.key == wanted else 0.0 for e in endpoints}

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        served = self._served(response, endpoint)
        if served is None:
            return
        headers = cycle.read(RESPONSE_HEADERS_KEY)
        if headers is None:
            headers = {}
            cycle.write(RESPONSE_HEADERS_KEY, headers)
        headers[HEADER] = encode_token(served)

    def _served(self, response: ResponseInfo, endpoint: Endpoint | None) -> EndpointKey | None:
        """The endpoint that served the response: Envoy may have fallen back to another endpoint of the
        target list, so prefer the served address when it names a pool endpoint."""
        served = response.served_endpoint
        if served and (endpoint is None or served != endpoint.hostport) and self._handle is not None:
            for e in self._handle.endpoints():
                if e.hostport == served:
                    return e.key
        return endpoint.key if endpoint is not None else None


def factory(name: str, params: Params, handle: Handle) -> SessionAffinityScorer:
    return SessionAffinityScorer(name, handle)
