"""Values exchanged between a protocol adapter and the director: what arrived (`RequestInput`), what the
director decided (`RoutingDecision`), what the adapter saw of the response (`ResponseSeen`, `Outcome`) and
what the director wants added to it (`ResponsePlan`). All frozen; nothing here knows a wire protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any

from llm_epp.framework import Endpoint, EppError, ErrorCode, InferenceRequest, SchedulingResult
from llm_epp.framework.parsing import ResponseReader
from llm_epp.framework.records import record
from llm_epp.framework.requestcontrol import Usage
from llm_epp.requestcontrol.lifecycle import RequestHandle

_EMPTY: Mapping[Any, Any] = MappingProxyType({})

# Values of the response header `x-llm-d-request-dropped-reason` (llm-d-router's vocabulary).
DROPPED_SATURATED = "rejected-saturated"
DROPPED_NO_ENDPOINTS = "rejected-no-endpoints"
DROPPED_EVICTED = "evicted"
"""A dispatched request flow control ended early to free capacity for higher-priority queued work."""


class RequestDropped(EppError):
    """An EppError that also names why the request was dropped before reaching a model server; adapters
    send `reason` in the `x-llm-d-request-dropped-reason` response header."""

    def __init__(self, code: ErrorCode, message: str, reason: str) -> None:
        super().__init__(code, message)
        self.reason = reason


@record
class RequestInput:
    """One request as an adapter received it.

    `headers`: lower-case names as received (`:path` included); `body`: the complete body, or None for a
    body-less request (GET): it is then sent to a random candidate without scheduling. `subset`: the
    gateway's endpoint subset hint (None = no hint, all endpoints). `request_id_generated`: the adapter made
    the id up (it then sets `x-request-id` upstream). `received_at`: on the director's clock (None = now)."""

    request_id: str
    headers: Mapping[str, str]
    body: bytes | None
    subset: Sequence[str] | None = None
    request_id_generated: bool = False
    received_at: float | None = None


@record
class RoutingDecision:
    """Where a request goes and what to forward.

    `endpoint`: the primary target; `destination`: the `ip:port[,ip:port...]` list (primary first); `body`:
    the body to forward when it differs from the one received (model rewritten), else None; `upstream_headers`:
    headers to set on the upstream request (PreRequest plugins' REQUEST_HEADERS_KEY, trace context), whose
    names the adapter also strips from what the client sent; `candidates`: the endpoints scheduled over
    (for explaining); `result`: None for a body-less request. `handle` is opaque: pass it back to
    `Director.response_received` and `Director.finish`."""

    request: InferenceRequest
    result: SchedulingResult | None
    endpoint: Endpoint
    destination: str
    handle: RequestHandle
    body: bytes | None = None
    upstream_headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    candidates: tuple[Endpoint, ...] = ()

    @property
    def model_rewritten(self) -> bool:
        """True when the forwarded body names another model than the client's (restore it in responses)."""
        req = self.request
        return self.body is not None and bool(req.incoming_model) and req.target_model != req.incoming_model

    def endpoint_scores(self) -> dict[str, float]:
        """`ip:port` -> the primary profile's summed score, for every endpoint it scored ({} without scores)."""
        primary = self.result.primary if self.result is not None else None
        if primary is None or not primary.scores:
            return {}
        hostports = {e.key: e.hostport for e in self.candidates}
        return {hostports[key]: parts.get("total", 0.0) for key, parts in primary.scores.items() if key in hostports}


@record
class ResponseSeen:
    """What an adapter saw in the response headers: the HTTP status, the endpoint that served the request
    (from the gateway; "" = unknown, the primary target is assumed), whether the body is a Server-Sent
    Events stream, and the headers the parser may look at (`content-type`)."""

    status: int = 0
    served_endpoint: str = ""
    streaming: bool = False
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


@record
class ResponsePlan:
    """The director's answer to response headers: headers to add to the client's response (from
    ResponseReceived plugins) and a reader for the body's usage (None: do not read the body). The reader is
    the only mutable part: the adapter feeds it every response body chunk, then passes its usage to finish."""

    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    reader: ResponseReader | None = None


@record
class Outcome:
    """How a request ended. `complete`: the response was received in full (False: cancelled, reset, expired).
    `status`: 0 = as reported to `response_received`. `response_bytes`: body bytes seen by the adapter."""

    complete: bool
    status: int = 0
    usage: Usage | None = None
    response_bytes: int = 0


NOTHING_TO_ADD: Mapping[str, Mapping[str, object]] = _EMPTY
