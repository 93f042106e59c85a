"""An in-test OTLP/gRPC trace collector: a real gRPC server on 127.0.0.1 that keeps every span it receives."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, with the service name of its resource."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Span]] = []
        self._lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    self.spans.extend((service, span) for span in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def received(self) -> list[tuple[str, Span]]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, done: Callable[[list[tuple[str, Span]]], bool], timeout: float = 20.0) -> list[tuple[str, Span]]:
        """The spans received once ``done`` holds for them; raises with what arrived when it never does."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"collector: condition not met; received {[s.name for _, s in spans]}")
            time.sleep(0.05)


@contextmanager
def running_collector() -> Iterator[tuple[Collector, int]]:
    """A collector listening on a free loopback port; yields it and the port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(None)
