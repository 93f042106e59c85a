"""Request-control extension points, run by the director around scheduling. PrepareData and Admission
are `async def` and run under deadlines; PreRequest and the response hooks are plain `def`s (they run
for every request and must be cheap). None may block the event loop.

Every hook gets the request's `CycleState`: one object for the whole life of the request, from
PrepareData through scheduling to completion, for plugins to pass data between their own hooks.

Pairing rule: a plugin that reserves something in `pre_request` releases it in `response_complete`.
The director calls `response_complete` exactly once for every request that reached `pre_request`,
whether it completed, failed, or the client went away; releases must still be idempotent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.records import record
from llm_epp.framework.state import CycleState, StateKey
from llm_epp.framework.types import Endpoint, InferenceRequest, SchedulingResult

# Headers plugins want added to the client's response (name -> value). A ResponseReceived hook writes
# them into the request's CycleState; the protocol adapter adds them to its response-headers answer.
RESPONSE_HEADERS_KEY: StateKey[dict[str, str]] = StateKey("response-headers")

# Headers plugins want set on the upstream request (name -> value), e.g. P/D's `x-prefiller-host-port`. A
# PreRequest hook writes them; the protocol adapter sets them on the routed request and drops any copy the
# client sent, so a client can never choose them.
REQUEST_HEADERS_KEY: StateKey[dict[str, str]] = StateKey("request-headers")

# Dynamic metadata plugins want attached to the response (namespace -> key -> value), e.g.
# `envoy.lb` / `x-gateway-inference-request-cost`. Written by ResponseComplete hooks, which the adapter runs
# before it answers the last response message, so the metadata rides on that answer.
RESPONSE_METADATA_KEY: StateKey[dict[str, dict[str, object]]] = StateKey("response-metadata")


@record
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ResponseInfo:
    """What is known of the model server's response when a response hook runs."""

    status: int = 0
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    served_endpoint: str = ""
    usage: Usage | None = None
    streaming: bool = False
    # Set on completion: False when the stream ended before the response finished (cancel, error).
    complete: bool = False
    # Set on completion when known: when the first response body bytes arrived, on the clock plugins read
    # with `Handle.now()` (for a streamed response, the first token). None: the body was not seen.
    first_body_at: float | None = None


@runtime_checkable
class Screener(Protocol):
    """Narrows the located candidates once per request, before PrepareData, the admission plugins and every
    scheduling profile, so no later filter, scorer or picker can undo it. Every screener sees the same input;
    the request goes on with the endpoints all of them kept (none: HTTP 503). Pure and synchronous."""

    @property
    def typed_name(self) -> TypedName: ...

    def screen(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]: ...


@runtime_checkable
class PrepareData(Protocol):
    """Computes per-request data for the candidates before scheduling (e.g. prefix matches)."""

    @property
    def typed_name(self) -> TypedName: ...

    async def prepare_data(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None: ...


@runtime_checkable
class Admission(Protocol):
    """Returns None to admit, or a reason string to refuse the request."""

    @property
    def typed_name(self) -> TypedName: ...

    async def admit(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> str | None: ...


@runtime_checkable
class PreRequest(Protocol):
    """Runs after a successful schedule, before the request is sent to the endpoint."""

    @property
    def typed_name(self) -> TypedName: ...

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class ResponseReceived(Protocol):
    """Runs when the model server's response headers arrive."""

    @property
    def typed_name(self) -> TypedName: ...

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None: ...


@runtime_checkable
class ResponseFirstBody(Protocol):
    """Runs once per scheduled request, when the first response body bytes reach the EPP: only when the gateway
    sends it response bodies (`llm-epp envoy-config --response-body-mode FULL_DUPLEX_STREAMED`). For a streamed
    response that is the first token; its headers may come long before (vLLM sends them on admission).
    `response.first_body_at` is set."""

    @property
    def typed_name(self) -> TypedName: ...

    def response_first_body(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None: ...


@runtime_checkable
class ResponseComplete(Protocol):
    """Runs exactly once per scheduled request when it ends, successfully or not."""

    @property
    def typed_name(self) -> TypedName: ...

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None: ...
