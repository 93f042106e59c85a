"""`--tracing`: the OpenTelemetry tracer exports over OTLP/gRPC to a real in-test collector."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from llm_epp.framework import NullRecorder
from llm_epp.framework.plugin import TypedName
from llm_epp.framework.tracing import CURRENT_TRACE, NULL_TRACER
from llm_epp.observability.tracing import (
    DEFAULT_SERVICE_NAME,
    OtelTracer,
    PluginSpanRecorder,
    UnsampledRequestTrace,
    build_tracer,
    shutdown_tracer,
    with_plugin_spans,
)
from tests.support.otlp_collector import Collector, running_collector

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    with running_collector() as running:
        yield running


def _env(port: int, **extra: str) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", **extra}


def _drive(tracer: OtelTracer, headers: dict[str, str]) -> dict[str, str]:
    """What the servicer and director do for one request; returns the headers sent upstream."""
    trace = tracer.start_request("req-1", headers)
    token = CURRENT_TRACE.set(trace)
    try:
        t0 = time.time_ns()
        trace.phase("parse", t0, t0 + 1_000)
        recorder = with_plugin_spans(NullRecorder(), tracer)
        recorder.plugin_duration("scorer", TypedName("queue-scorer", "queue"), 0.0002)
        trace.phase("schedule", t0 + 1_000, t0 + 5_000, {"candidates": 3})
        trace.event("picked", {"endpoint": "pod-a"})
        upstream: dict[str, str] = {}
        trace.inject(upstream)
    finally:
        CURRENT_TRACE.reset(token)
    trace.end(200)
    trace.end(500)  # idempotent: the first status stays
    return upstream


def test_request_span_continues_the_incoming_trace_and_is_exported(collector: tuple[Collector, int]) -> None:
    received, port = collector
    tracer = build_tracer(True, _env(port, OTEL_TRACES_SAMPLER_ARG="0"))  # ratio 0: only the parent samples
    assert isinstance(tracer, OtelTracer)
    upstream = _drive(tracer, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "vendor=x"})
    shutdown_tracer(tracer)  # flushes the batch processor

    spans = {span.name: (service, span) for service, span in received.spans}
    assert set(spans) == {"gateway.request", "parse", "schedule", "plugin.scorer"}
    service, request = spans["gateway.request"]
    assert service == DEFAULT_SERVICE_NAME
    assert request.trace_id.hex() == TRACE_ID
    assert request.parent_span_id.hex() == PARENT_ID
    assert request.kind == Span.SPAN_KIND_SERVER
    attrs = {a.key: a.value for a in request.attributes}
    assert attrs["request.id"].string_value == "req-1"
    assert attrs["http.response.status_code"].int_value == 200
    assert [e.name for e in request.events] == ["picked"]
    for child in ("parse", "schedule", "plugin.scorer"):
        span = spans[child][1]
        assert span.trace_id.hex() == TRACE_ID
        assert span.parent_span_id == request.span_id, child
    plugin_attrs = {a.key: a.value.string_value for a in spans["plugin.scorer"][1].attributes}
    assert plugin_attrs["plugin.type"] == "queue-scorer" and plugin_attrs["plugin.name"] == "queue"
    schedule = spans["schedule"][1]
    assert schedule.end_time_unix_nano - schedule.start_time_unix_nano == 4_000

    version, trace_id, span_id, flags = upstream["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert span_id == request.span_id.hex()  # the model server's spans hang under the request span
    assert upstream["tracestate"] == "vendor=x"


def test_sampled_out_requests_export_nothing_but_still_propagate(collector: tuple[Collector, int]) -> None:
    received, port = collector
    tracer = build_tracer(True, _env(port, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0"))
    assert isinstance(tracer, OtelTracer)
    upstream = _drive(tracer, {})
    shutdown_tracer(tracer)
    assert received.spans == []
    flags = int(upstream["traceparent"].rsplit("-", 1)[1], 16)
    assert flags & 1 == 0  # a fresh trace id, flagged not sampled


def test_service_name_and_sampler_come_from_the_environment(
    collector: tuple[Collector, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    received, port = collector
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-epp")
    tracer = build_tracer(True, _env(port, OTEL_TRACES_SAMPLER="always_on"))
    assert isinstance(tracer, OtelTracer)
    _drive(tracer, {})
    shutdown_tracer(tracer)
    assert {service for service, _ in received.spans} == {"my-epp"}
    assert len(received.spans) == 4


def test_reference_defaults_and_fallbacks(caplog: pytest.LogCaptureFixture) -> None:
    tracer = build_tracer(True, {"OTEL_TRACES_EXPORTER": "none"})
    assert isinstance(tracer, OtelTracer)
    assert tracer.provider.sampler.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.1}")
    shutdown_tracer(tracer)
    tracer = build_tracer(True, {"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_TRACES_SAMPLER": "jaeger_remote"})
    assert isinstance(tracer, OtelTracer)
    assert tracer.provider.sampler.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.1}")
    shutdown_tracer(tracer)
    assert "OTEL_TRACES_EXPORTER='zipkin'" in caplog.text and "OTEL_TRACES_SAMPLER='jaeger_remote'" in caplog.text


def test_tracing_off_is_the_null_tracer_and_an_unwrapped_recorder() -> None:
    tracer = build_tracer(False)
    assert tracer is NULL_TRACER
    recorder = NullRecorder()
    assert with_plugin_spans(recorder, tracer) is recorder
    assert isinstance(
        with_plugin_spans(recorder, build_tracer(True, {"OTEL_TRACES_EXPORTER": "none"})), PluginSpanRecorder
    )


def test_an_otlp_exporter_that_cannot_load_is_a_startup_error_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """xds-protos ships an older opentelemetry/proto; when it wins the install, the exporter cannot import."""
    import sys

    from llm_epp.observability import tracing

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(tracing.TracingSetupError, match="force-reinstall --no-deps opentelemetry-proto"):
        tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp"})
    assert tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "none"}) == []


def _sdk_only(sampler: object) -> OtelTracer:
    """The same tracer without the decide-first path (the SDK's own id generator): the reference behaviour."""
    return OtelTracer(TracerProvider(sampler=sampler))  # type: ignore[arg-type]


def _traceparents(tracer: OtelTracer, requests: int, headers: dict[str, str] | None = None) -> list[str]:
    random.seed(7)  # both tracers draw their ids from the `random` module in the same order
    out = []
    for _ in range(requests):
        trace = tracer.start_request("r", headers or {})
        upstream: dict[str, str] = {}
        trace.inject(upstream)
        trace.end(200)
        out.append(upstream["traceparent"])
    return out


@pytest.mark.parametrize(
    ("sampler", "env"),
    [
        (ParentBased(TraceIdRatioBased(0.3)), {"OTEL_TRACES_SAMPLER_ARG": "0.3"}),
        (TraceIdRatioBased(0.5), {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}),
        (ParentBased(ALWAYS_OFF), {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}),
    ],
    ids=["default-parentbased-ratio", "ratio", "always-off"],
)
def test_deciding_first_propagates_exactly_what_the_sdk_would(sampler: object, env: dict[str, str]) -> None:
    fast = build_tracer(True, {"OTEL_TRACES_EXPORTER": "none", **env})
    assert isinstance(fast, OtelTracer)
    got = _traceparents(fast, 400)
    want = _traceparents(_sdk_only(sampler), 400)
    assert got == want  # same trace ids, span ids and flags, sampled or not
    flags = {p.rsplit("-", 1)[1] for p in got}
    if env.get("OTEL_TRACES_SAMPLER") == "parentbased_always_off":
        assert {int(f, 16) & 1 for f in flags} == {0}
    else:
        assert {int(f, 16) & 1 for f in flags} == {0, 1}  # both decisions were exercised


def test_sampled_out_requests_skip_the_sdk_and_record_nothing() -> None:
    exported = InMemorySpanExporter()
    tracer = build_tracer(True, {"OTEL_TRACES_SAMPLER_ARG": "0"}, processors=(SimpleSpanProcessor(exported),))
    assert isinstance(tracer, OtelTracer)
    trace = tracer.start_request("r", {"user-agent": "x"})
    assert isinstance(trace, UnsampledRequestTrace) and not trace.recording
    token = CURRENT_TRACE.set(trace)
    try:
        with_plugin_spans(NullRecorder(), tracer).plugin_duration("Scorer", TypedName("queue-scorer", "q"), 0.001)
        trace.phase("parse", 1, 2)
    finally:
        CURRENT_TRACE.reset(token)
    trace.end(200)
    assert exported.get_finished_spans() == ()


def test_a_sampled_request_decided_first_is_the_sdks_span_with_that_trace_id() -> None:
    exported = InMemorySpanExporter()
    tracer = build_tracer(True, {"OTEL_TRACES_SAMPLER_ARG": "1"}, processors=(SimpleSpanProcessor(exported),))
    assert isinstance(tracer, OtelTracer)
    upstream = _drive(tracer, {})
    spans = {s.name: s for s in exported.get_finished_spans()}
    assert set(spans) == {"gateway.request", "parse", "schedule", "plugin.scorer"}
    _, trace_id, span_id, flags = upstream["traceparent"].split("-")
    request = spans["gateway.request"].context
    assert (f"{request.trace_id:032x}", f"{request.span_id:016x}") == (trace_id, span_id)
    assert int(flags, 16) & 1 == 1


def test_a_request_with_trace_context_or_baggage_goes_through_the_sdk() -> None:
    tracer = build_tracer(True, {"OTEL_TRACES_EXPORTER": "none", "OTEL_TRACES_SAMPLER_ARG": "0"})
    assert isinstance(tracer, OtelTracer)
    parent = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"}
    assert _traceparents(tracer, 5, parent) == _traceparents(_sdk_only(ParentBased(TraceIdRatioBased(0))), 5, parent)
    trace = tracer.start_request("r", {"baggage": "tenant=a"})
    upstream: dict[str, str] = {}
    trace.inject(upstream)
    assert upstream["baggage"] == "tenant=a"


def test_the_plugin_span_recorder_hands_other_calls_straight_to_the_inner_recorder() -> None:
    inner = NullRecorder()
    recorder = PluginSpanRecorder(inner)
    assert recorder.running_requests == inner.running_requests
    assert recorder.request_completed == inner.request_completed


def test_phases_become_child_spans_with_their_own_times_when_the_request_ends() -> None:
    """A sampled request's phases and plugin calls cost no SDK span on its way to its answers: they are
    exported as the request's children, with the times they were given, once it ends; none after that."""
    exported = InMemorySpanExporter()
    tracer = build_tracer(True, {"OTEL_TRACES_SAMPLER_ARG": "1"}, processors=(SimpleSpanProcessor(exported),))
    trace = tracer.start_request("r", {})
    token = CURRENT_TRACE.set(trace)
    try:
        trace.phase("parse", 1_000, 2_000, {"model": "m"})
        with_plugin_spans(NullRecorder(), tracer).plugin_duration("Scorer", TypedName("queue-scorer", "q"), 0.001)
    finally:
        CURRENT_TRACE.reset(token)
    assert exported.get_finished_spans() == ()
    trace.end(200)
    trace.phase("late", 3_000, 4_000)
    spans = {s.name: s for s in exported.get_finished_spans()}
    assert set(spans) == {"gateway.request", "parse", "plugin.Scorer"}
    request = spans["gateway.request"]
    parse = spans["parse"]
    assert (parse.start_time, parse.end_time, dict(parse.attributes or {})) == (1_000, 2_000, {"model": "m"})
    assert parse.parent is not None and parse.parent.span_id == request.context.span_id
    assert spans["plugin.Scorer"].parent.span_id == request.context.span_id
    assert dict(request.attributes or {})["http.response.status_code"] == 200
