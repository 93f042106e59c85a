"""`--enable-grpc-stream-metrics`: the ext_proc stream metrics of llm-d-router (names, help, buckets):

- `llm_d_epp_extproc_streams_inflight` (gauge): ext_proc streams open now;
- `llm_d_epp_extproc_stream_duration_seconds` (histogram): how long each stream stayed open;
- `llm_d_epp_extproc_streams_total{code}` (counter): streams ended, by gRPC status code in Go's spelling
  (`OK`, `Canceled`, `ResourceExhausted`, ...; 17 values at most).

Counted by a server interceptor around the ext_proc `Process` method only (the health service sharing the
port is left out), registered only when the flag is given."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llm_epp.observability.metrics import _Buckets, _histogram, _View

EXT_PROC_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)
_ALPHA = "[ALPHA] "
# grpc.StatusCode name -> Go's codes.Code.String()
GO_CODE_NAMES = {code: "".join(part.capitalize() for part in code.name.split("_")) for code in grpc.StatusCode} | {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
}


class _DurationCollector(Collector):
    """One unlabelled histogram, exposed through the same writer as the EPP's other histograms."""

    def __init__(self, name: str, doc: str) -> None:
        self._view = _View(name, doc, ())
        self._buckets = _Buckets(BUCKETS)
        self.child = self._buckets.child()

    def collect(self) -> Iterator[Metric]:
        yield _histogram(self._view, self._buckets, [((), self.child)])


class StreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.inflight = Gauge(
            "llm_d_epp_extproc_streams_inflight",
            _ALPHA + "Number of ext_proc gRPC streams currently open.",
            registry=registry,
        )
        self._duration = _DurationCollector(  # `le` written as the Go client writes it, like every other histogram
            "llm_d_epp_extproc_stream_duration_seconds",
            _ALPHA + "Duration an ext_proc gRPC stream stays open, in seconds.",
        )
        registry.register(self._duration)
        self.duration = self._duration.child
        self.total = Counter(
            "llm_d_epp_extproc_streams",
            _ALPHA + "Total ext_proc gRPC streams completed, by gRPC status code.",
            ("code",),
            registry=registry,
        )

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _Interceptor(self)


def _code(context: grpc.aio.ServicerContext, default: grpc.StatusCode) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return GO_CODE_NAMES[code]
    return GO_CODE_NAMES[default]


class _Interceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, metrics: StreamMetrics) -> None:
        self._m = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method != EXT_PROC_METHOD or handler.stream_stream is None:
            return handler
        behavior = handler.stream_stream
        m = self._m

        async def counted(requests: Any, context: grpc.aio.ServicerContext) -> None:
            m.inflight.inc()
            start = time.perf_counter()
            code = "OK"
            try:
                result = behavior(requests, context)
                if inspect.isasyncgen(result):
                    async for response in result:
                        await context.write(response)
                elif inspect.isawaitable(result):
                    await result
                code = _code(context, grpc.StatusCode.OK)
            except asyncio.CancelledError:
                code = GO_CODE_NAMES[grpc.StatusCode.CANCELLED]
                raise
            except grpc.aio.AbortError:
                code = _code(context, grpc.StatusCode.UNKNOWN)
                raise
            except Exception:
                code = GO_CODE_NAMES[grpc.StatusCode.UNKNOWN]
                raise
            finally:
                m.inflight.dec()
                m.duration.observe(time.perf_counter() - start)
                m.total.labels(code).inc()

        return grpc.stream_stream_rpc_method_handler(
            counted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
