"""`--tracing=true` through a real Envoy: the EPP exports each request's spans over OTLP/gRPC to an in-test
collector, continues the client's trace, and hands the trace context on to the model server it picked."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from llm_epp.sim.stub import BackendPool
from tests.envoy.conftest import Stack, start_stack, stop_stack
from tests.support.otlp_collector import Collector, running_collector

pytestmark = pytest.mark.envoy

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[Stack, Collector]]:
    with running_collector() as (collector, port), BackendPool(2) as pods:
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s instead of 5 s
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        }
        stack = start_stack(pods, epp_args=("--tracing=true",), epp_env=env)
        try:
            yield stack, collector
        finally:
            stop_stack(stack)


def _spans_of(spans: list[tuple[str, Span]], trace_id: str) -> dict[str, Span]:
    return {span.name: span for _, span in spans if span.trace_id.hex() == trace_id}


def test_a_request_continues_the_client_trace_and_its_spans_reach_the_collector(
    traced: tuple[Stack, Collector],
) -> None:
    stack, collector = traced
    r = httpx.post(
        stack.url("/v1/completions"),
        json={"model": "m", "prompt": "trace me", "max_tokens": 4},
        headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "tenant=blue"},
        timeout=30,
    )
    assert r.status_code == 200, r.text

    spans = _spans_of(
        collector.wait_for(lambda got: {"gateway.request", "schedule"} <= set(_spans_of(got, TRACE_ID))), TRACE_ID
    )
    request = spans["gateway.request"]
    assert request.parent_span_id.hex() == CLIENT_SPAN
    assert request.kind == Span.SPAN_KIND_SERVER
    status = {a.key: a.value.int_value for a in request.attributes}.get("http.response.status_code")
    assert status == 200
    assert {"parse", "schedule"} <= set(spans)
    assert any(name.startswith("plugin.") for name in spans), sorted(spans)
    for name, span in spans.items():
        if name != "gateway.request":
            assert span.parent_span_id == request.span_id, name

    # the pod that served the request got the EPP's span as its parent, and the client's trace state
    served = [req for pod in stack.backends.backends for req in pod.served_requests()]
    assert len(served) == 1
    version, trace_id, parent, flags = served[0].headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert parent == request.span_id.hex()
    assert served[0].headers["tracestate"] == "tenant=blue"


def test_a_request_without_trace_context_starts_a_trace_the_pod_joins(traced: tuple[Stack, Collector]) -> None:
    stack, collector = traced
    stack.backends.reset()
    r = httpx.post(stack.url("/v1/completions"), json={"model": "m", "prompt": "fresh"}, timeout=30)
    assert r.status_code == 200, r.text
    served = [req for pod in stack.backends.backends for req in pod.served_requests()]
    assert len(served) == 1
    trace_id = served[0].headers["traceparent"].split("-")[1]
    assert trace_id != TRACE_ID and int(trace_id, 16) != 0
    spans = _spans_of(collector.wait_for(lambda got: "gateway.request" in _spans_of(got, trace_id)), trace_id)
    assert spans["gateway.request"].parent_span_id == b""  # a root span: nothing came from the client
