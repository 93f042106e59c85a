"""Tracing seam: the request path reports spans through these protocols; the observability package
implements them with OpenTelemetry (`--tracing`). With tracing off, `NULL_TRACER` costs one attribute read.

A `RequestTrace` lives for one request, from the first request header to completion. The protocol adapter
starts it (continuing a W3C `traceparent` the client sent), makes it current in `CURRENT_TRACE` for the
request's task, injects the trace context into the upstream request headers, and ends it exactly once.
The director reports its phases (`parse`, `admission`, `prepare_data`, `schedule`, `pre_request`, ...) with
wall-clock nanosecond timestamps (`time.time_ns()`); a recorder may add per-plugin child spans from
`CURRENT_TRACE`."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Protocol

AttributeValue = str | int | float | bool


class RequestTrace(Protocol):
    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        """A finished child span of the request's span. It may be exported only when the request ends, so
        `attributes` must not change after the call."""
        ...

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None: ...

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None: ...

    def inject(self, headers: dict[str, str]) -> None:
        """Adds the W3C trace context (`traceparent`, `tracestate`) for the upstream request to `headers`."""
        ...

    def end(self, status: int = 0, error: str = "") -> None:
        """Ends the request span (idempotent). `status`: the HTTP status answered, 0 if none."""
        ...


class Tracer(Protocol):
    @property
    def enabled(self) -> bool: ...

    def start_request(self, request_id: str, headers: Mapping[str, str]) -> RequestTrace: ...


class _NullTrace:
    __slots__ = ()

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        pass

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        pass

    def inject(self, headers: dict[str, str]) -> None:
        pass

    def end(self, status: int = 0, error: str = "") -> None:
        pass


NULL_TRACE: RequestTrace = _NullTrace()


class _NullTracer:
    __slots__ = ()

    @property
    def enabled(self) -> bool:
        return False

    def start_request(self, request_id: str, headers: Mapping[str, str]) -> RequestTrace:
        return NULL_TRACE


NULL_TRACER: Tracer = _NullTracer()

CURRENT_TRACE: ContextVar[RequestTrace | None] = ContextVar("llm_epp_current_trace", default=None)
"""The trace of the request the current task is handling (None outside a request or with tracing off)."""
